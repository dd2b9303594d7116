"""Registered models: `models:/<name>/<version>` or `models:/<name>@<alias>` as a model path.

A registered model version is a Hugging Face folder in MLflow's model registry (the platform
registers a run's exported checkpoint there). The training commands put its local copy in the
spec before any model loads (rl_core.recipes.warm.with_model_folders):

    ref = parse_registry_uri("models:/adder@champion")   # RegistryRef("adder", None, "champion")
    folder = fetch_registered("models:/adder/3")          # downloaded once, then cached

The copy lives under `$ASCENT_CACHE_DIR/models/<name>/<version>-<digest>` (beside the tiny
models), keyed by the concrete version and where it is stored, so an alias is resolved on every
fetch and a version is downloaded once per node (processes asking at once wait on a lock).
`registered.json` in the folder says which version it is and which run produced it; a run's
lineage reads it. The registry is the tracking server of MLFLOW_TRACKING_URI (MLFLOW_REGISTRY_URI when set).

Parsing is torch-free and mlflow-free (the web process validates specs with it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_core.errors import InputError
from rl_core.models.presets import cache_root

log = logging.getLogger("rl_core")

SCHEME = "models:/"
REGISTERED_FILE = "registered.json"
# MLflow's registered-model names: letters, digits and . _ - (and spaces, which a path refuses)
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_URI = re.compile(rf"^models:/(?P<name>{_NAME})(?:/(?P<version>[1-9][0-9]{{0,8}})"
                  rf"|@(?P<alias>[A-Za-z_][A-Za-z0-9_-]{{0,63}}))$")
FORMS = "models:/<name>/<version> (e.g. models:/adder/3) or models:/<name>@<alias>"


@dataclass(frozen=True)
class RegistryRef:
    """One registered model version, by number or by alias."""

    name: str
    version: int | None = None
    alias: str | None = None

    @property
    def uri(self) -> str:
        return f"{SCHEME}{self.name}/{self.version}" if self.version else \
            f"{SCHEME}{self.name}@{self.alias}"


def is_registry_uri(path: str | os.PathLike | None) -> bool:
    return isinstance(path, str) and path.startswith(SCHEME)


def parse_registry_uri(path: str) -> RegistryRef | None:
    """The reference of `models:/...` text; None for any other path; ValueError naming the two
    forms when it starts with `models:/` but is neither."""
    if not is_registry_uri(path):
        return None
    match = _URI.match(path)
    if match is None:
        raise ValueError(f"{path!r} is not a registered model: write {FORMS}")
    version = match.group("version")
    return RegistryRef(match.group("name"), int(version) if version else None,
                       match.group("alias"))


# The spec fields that may name a model folder: (section, field).
MODEL_FIELDS = (("model", "path"), ("model", "tokenizer_path"), ("critic", "model_path"))


def with_registered_models(spec: Any) -> Any:
    """`spec` (a RunSpec) with the local folder of each registered version it names in place of
    its `models:/` path; the same spec when it names none."""
    changes: dict[str, Any] = {}
    for section, field in MODEL_FIELDS:
        value = getattr(getattr(spec, section), field)
        if is_registry_uri(value):
            current = changes.get(section, getattr(spec, section))
            changes[section] = current.model_copy(update={field: str(fetch_registered(value))})
    return spec.model_copy(update=changes) if changes else spec


def registry_cache_root() -> Path:
    return cache_root() / "models"


def fetch_registered(path: str, tracking_uri: str | None = None) -> Path:
    """The local folder of the registered model version `path`, downloaded on first use."""
    ref = parse_registry_uri(path)
    if ref is None:
        raise ValueError(f"{path!r} is not a models:/ path")
    uri = (tracking_uri or os.environ.get("MLFLOW_REGISTRY_URI")
           or os.environ.get("MLFLOW_TRACKING_URI"))
    if not uri:
        raise InputError(f"{path}: a registered model needs the registry's server: set "
                             "MLFLOW_TRACKING_URI (the platform sets it for its runs)")
    client, mlflow_error = _client(uri)
    try:
        if ref.alias is not None:
            version = client.get_model_version_by_alias(ref.name, ref.alias)
        else:
            version = client.get_model_version(ref.name, str(ref.version))
    except mlflow_error as exc:
        raise InputError(f"{path}: the registry at {uri} has no such version "
                             f"({_first_line(exc)})") from None
    folder = registry_cache_root() / ref.name / _cache_key(uri, version)
    if (folder / REGISTERED_FILE).is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(folder.with_name(f".{folder.name}.lock")):
        if not (folder / REGISTERED_FILE).is_file():
            _download(ref, version, uri, folder, mlflow_error)
    return folder


def _cache_key(uri: str, version) -> str:
    """The version's number and a digest of where it is and what it holds: another registry,
    or a registry rebuilt with other versions under the same numbers, never reuses a copy."""
    facts = json.dumps([uri, version.source, version.run_id, version.creation_timestamp])
    return f"{version.version}-{hashlib.sha256(facts.encode()).hexdigest()[:12]}"


def registered_origin(folder: str | Path) -> dict | None:
    """What `registered.json` of a fetched folder says (uri, name, version, run_id, source)."""
    file = Path(folder) / REGISTERED_FILE
    try:
        return json.loads(file.read_text()) if file.is_file() else None
    except (OSError, ValueError):
        return None


def _download(ref: RegistryRef, version, uri: str, folder: Path, mlflow_error) -> None:
    from mlflow.artifacts import download_artifacts

    concrete = f"{SCHEME}{ref.name}/{version.version}"
    log.info("downloading %s (%s) into %s", concrete, ref.uri, folder)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        try:
            local = Path(download_artifacts(artifact_uri=concrete, dst_path=str(staging),
                                            tracking_uri=uri))
        except mlflow_error as exc:
            raise InputError(f"{ref.uri}: could not download {concrete} from {uri} "
                                 f"({_first_line(exc)})") from None
        if not (local / "config.json").is_file():
            raise InputError(f"{ref.uri}: version {version.version} holds no Hugging Face "
                                 f"folder (no config.json in {version.source})")
        (local / REGISTERED_FILE).write_text(json.dumps({
            "uri": concrete, "asked": ref.uri, "name": ref.name, "version": int(version.version),
            "run_id": version.run_id or None, "source": version.source}, indent=1))
        local.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _client(uri: str):
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri), MlflowException


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Holds an exclusive lock on `path` (created) across processes of one machine."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
