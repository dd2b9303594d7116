"""A run's lineage: what its model was trained from, written once at the start of training.

    lineage = record_lineage(spec, output_dir, tracker)   # lineage/lineage.json, also an artifact

`lineage.json` names the data files with their sizes and SHA-256 content hashes (or the synthetic
task that generated the prompts), the resolved spec, the code (rl_core's version, the git commit
of its checkout where it has one, or ASCENT_CODE_VERSION; torch and transformers versions), the
parent model (its folder, and the registered version or warm start it came from, read from the
`registered.json` / `warm.json` beside its weights) and the run (its MLflow run id and, under the
platform, ASCENT_RUN_ID). The platform copies it into each model version registered from the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

from rl_core import __version__
from rl_core.models.registry import registered_origin

FORMAT = 1
FOLDER = "lineage"
FILE = "lineage.json"
CODE_ENV = "ASCENT_CODE_VERSION"
_CHUNK = 1 << 20


def lineage_of(spec: Any, mlflow_run_id: str | None = None) -> dict[str, Any]:
    """The lineage of a run of `spec` (a RunSpec whose model folders are local)."""
    data = spec.data
    files = [{"split": split, **file_facts(path)}
             for split, paths in (("train", data.train_files), ("val", data.val_files))
             for path in paths]
    return {
        "format": FORMAT,
        "run": {"name": spec.name, "mlflow_run_id": mlflow_run_id,
                "platform_run_id": _int(os.environ.get("ASCENT_RUN_ID")),
                "attempt": _int(os.environ.get("ASCENT_ATTEMPT"))},
        "code": code_version(),
        "model": model_facts(spec.model.path),
        "data": {"files": files,
                 "synthetic": data.synthetic.model_dump(mode="json") if data.synthetic else None},
        "spec": spec.model_dump(mode="json"),
    }


def record_lineage(spec: Any, output_dir: str | Path, tracker: Any) -> dict[str, Any]:
    """Write the lineage under `output_dir/lineage` and log it as the run's `lineage` artifact."""
    lineage = lineage_of(spec, getattr(tracker, "mlflow_run_id", None))
    folder = Path(output_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / FILE).write_text(json.dumps(lineage, indent=1, sort_keys=True) + "\n")
    tracker.log_artifacts(folder, FOLDER)
    return lineage


def file_facts(path: str | Path) -> dict[str, Any]:
    """{"path", "bytes", "sha256"} of one file (streamed: any size)."""
    file = Path(path)
    digest = hashlib.sha256()
    with file.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return {"path": str(path), "bytes": file.stat().st_size, "sha256": digest.hexdigest()}


def model_facts(path: str) -> dict[str, Any]:
    """The parent model: its folder and, where it came from the registry or is a warm start,
    which version or recipe it is."""
    facts: dict[str, Any] = {"path": path, "registered": None, "warm_start": None}
    folder = Path(path)
    if folder.is_dir():
        facts["registered"] = registered_origin(folder)
        warm = folder / "warm.json"
        if warm.is_file():
            facts["warm_start"] = json.loads(warm.read_text()).get("name")
    return facts


def code_version() -> dict[str, Any]:
    """rl_core's version and commit, and the versions of the libraries that shape training."""
    return {"rl_core": __version__, "commit": os.environ.get(CODE_ENV) or _git_commit(),
            "torch": _version("torch"), "transformers": _version("transformers")}


def _git_commit() -> str | None:
    """The commit of the checkout rl_core runs from (with `+changes` when it has uncommitted
    changes to tracked files), or None when it is not a git checkout."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True,
                               timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+changes" if dirty else head


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None
