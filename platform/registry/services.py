"""Registering a run's checkpoint as a model version, changing versions, and checking the
`models:/` paths of submitted specs. Shared by the REST API, the web UI and the worker.

`register` checks the request and stores a PENDING version; the worker's `export_and_register`
downloads the checkpoint from MLflow, exports it as a Hugging Face folder (rl_core.export: the
float32 master weights of a sharded checkpoint, cast to the run's model dtype), logs the folder
to the run as `exported/step_<N>`, registers it in MLflow's model registry under the model's name
(the version number is MLflow's), sets its aliases and copies the run's lineage into the row.
A failure leaves the version FAILED with the reason; registering again makes a new one.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import Prefetch, QuerySet

from ascent.errors import DomainError, RequestError
from experiments.models import Run
from experiments.services import notify_worker
from experiments.tracking import TrackingUnavailable, artifacts, read_json
from registry.models import ModelAlias, ModelVersion, RegisteredModel, VersionState
from rl_core.admission import parse_registry_uri
from rl_core.spec import RunSpec, SpecError

log = logging.getLogger("ascent.registry")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ALIAS = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
RESERVED_ALIAS = re.compile(r"^(latest|v[0-9]+)$", re.IGNORECASE)  # MLflow's own meanings
MAX_TAGS = 50
TASK = "workers.tasks.register_model_version"


# --------------------------------------------------------------------------- reading

def visible_models(user) -> QuerySet[RegisteredModel]:
    """Models of the projects `user` belongs to (every model for staff)."""
    models = RegisteredModel.objects.select_related("project")
    if user.is_staff:
        return models
    return models.filter(project__memberships__user=user)


def visible_versions(user) -> QuerySet[ModelVersion]:
    versions = ModelVersion.objects.select_related("model", "model__project", "run", "created_by")
    if user.is_staff:
        return versions
    return versions.filter(model__project__memberships__user=user)


def versions_prefetch() -> Prefetch:
    """A runs query's `prefetch_related` of each run's ready versions (`run.ready_versions`)."""
    return Prefetch("model_versions", to_attr="ready_versions",
                    queryset=ModelVersion.objects.filter(state=VersionState.READY)
                    .select_related("model").order_by("id"))


def parent_of(version: ModelVersion) -> ModelVersion | None:
    """The registered version this version's run started from (from its lineage), if any."""
    registered = ((version.lineage or {}).get("model") or {}).get("registered") or {}
    if not registered.get("name") or not registered.get("version"):
        return None
    return ModelVersion.objects.select_related("model").filter(
        model__name=registered["name"], version=registered["version"]).first()


def mlflow_url(name: str, version: int | None = None) -> str:
    """The model (or one version) in the MLflow UI."""
    base = f"{settings.MLFLOW_TRACKING_URI.rstrip('/')}/#/models/{quote(name, safe='')}"
    return f"{base}/versions/{version}" if version else base


def started_from(run: Run) -> str:
    """The `models:/` path the run's spec starts from, or ""."""
    path = ((run.spec or {}).get("model") or {}).get("path") or ""
    return path if path.startswith("models:/") else ""


# --------------------------------------------------------------------------- input checks

def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise RequestError("name", "A model name is 1-128 letters, digits, dots, underscores or "
                                   "hyphens, starting with a letter or digit (e.g. qwen-math).")
    return name


def check_aliases(aliases: Sequence[str]) -> list[str]:
    out = []
    for alias in aliases:
        if not isinstance(alias, str) or not ALIAS.match(alias) or RESERVED_ALIAS.match(alias):
            raise RequestError("aliases", f"{alias!r} is not an alias: 1-64 letters, digits, _ "
                                          "or -, starting with a letter or _ (not 'latest' nor "
                                          "v<number>, which name versions)")
        if alias not in out:
            out.append(alias)
    return out


def check_tags(tags: Mapping[str, str]) -> dict[str, str]:
    if len(tags) > MAX_TAGS:
        raise RequestError("tags", f"At most {MAX_TAGS} tags.")
    for key, value in tags.items():
        if not isinstance(key, str) or not 0 < len(key) <= 250 or not isinstance(value, str) \
                or len(value) > 5000:
            raise RequestError("tags", f"Tag {key!r}: a key of 1-250 characters and a text value "
                                       "of at most 5000.")
    return dict(tags)


def check_model_paths(spec: RunSpec, project, user) -> None:
    """A submitted spec's `models:/` paths must name a ready version (or alias) of a model the
    submitter can read; SpecError naming the field otherwise (experiments.services.SPEC_CHECKS)."""
    fields = (("model.path", spec.model.path), ("model.tokenizer_path", spec.model.tokenizer_path),
              ("critic.model_path", spec.critic.model_path))
    errors = []
    for field, path in fields:
        ref = parse_registry_uri(path) if isinstance(path, str) else None
        if ref is None:
            continue
        model = visible_models(user).filter(name=ref.name).first()
        if model is None:
            errors.append({"field": field, "message": (
                f"{path}: no registered model named {ref.name!r} that you can read; see the "
                "Models page (GET /api/v1/models/) for the names")})
            continue
        ready = model.versions.filter(state=VersionState.READY)
        found = (ready.filter(version=ref.version) if ref.version is not None
                 else ready.filter(aliases__name=ref.alias))
        if not found.exists():
            shown = ", ".join(f"{v.version}" + (f" ({', '.join(v.alias_names())})"
                                                if v.alias_names() else "")
                              for v in ready.order_by("version")) or "none yet"
            what = f"version {ref.version}" if ref.version is not None else f"alias {ref.alias!r}"
            errors.append({"field": field, "message": (
                f"{path}: model {ref.name} has no ready {what}; its ready versions: {shown}")})
    if errors:
        raise SpecError(errors)


# --------------------------------------------------------------------------- writing

def register(run: Run, user, *, name: str, step: int | None = None, description: str = "",
             tags: Mapping[str, str] | None = None, aliases: Sequence[str] = ()
             ) -> ModelVersion:
    """A new PENDING version of model `name` (made in the run's project when new) from the run's
    checkpoint at `step` (default: its latest); the worker exports and registers it."""
    project = run.experiment.project
    if not project.can_write(user):
        raise PermissionDenied("Only the project's owners and maintainers may register models.")
    name, aliases, tags = check_name(name), check_aliases(aliases), check_tags(tags or {})
    _check_owner(name, project)
    steps = checkpoint_steps(run)
    if not steps:
        raise DomainError(f"Run {run.pk} has no checkpoint in MLflow yet: a run logs its final "
                          "checkpoint when it ends (trainer.save_every adds earlier ones).")
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise RequestError("step", f"Run {run.pk} has no checkpoint at step {step}; its "
                                   f"checkpoints: {', '.join(map(str, steps))}.")
    with transaction.atomic():
        model = RegisteredModel.objects.select_for_update().filter(name=name).first()
        if model is None:
            model = RegisteredModel.objects.create(project=project, name=name, created_by=user)
        _check_owner(name, project)
        version = ModelVersion.objects.create(
            model=model, run=run, step=step, description=description, tags=tags,
            pending_aliases=aliases, created_by=user)
        model.save(update_fields=["updated_at"])
        transaction.on_commit(lambda: notify_worker(TASK, version.pk))
    return version


def _check_owner(name: str, project) -> None:
    if RegisteredModel.objects.filter(name=name).exclude(project=project).exists():
        raise RequestError("name", f"The name {name!r} belongs to a model of another project; "
                                   "choose another name.")


def checkpoint_steps(run: Run) -> list[int]:
    """The steps of the run's checkpoints in MLflow, ascending."""
    try:
        rows = artifacts(run)
    except TrackingUnavailable as exc:
        raise DomainError(str(exc)) from exc
    return sorted({row["step"] for row in rows if row.get("step") is not None})


def update_version(version: ModelVersion, user, *, description: str | None = None,
                   tags: Mapping[str, str] | None = None, aliases: Sequence[str] | None = None
                   ) -> ModelVersion:
    """Change a version's description, tags (replaced) or aliases (replaced; an alias moves
    here from the version that had it), here and, once registered, in MLflow."""
    require_writer(version.model, user)
    tags = None if tags is None else check_tags(tags)
    aliases = None if aliases is None else check_aliases(aliases)
    with transaction.atomic():
        version = ModelVersion.objects.select_for_update().get(pk=version.pk)
        old_tags, old_aliases = dict(version.tags), version.alias_names()
        if description is not None:
            version.description = description
        if tags is not None:
            version.tags = tags
        ready = version.state == VersionState.READY
        if aliases is not None and ready:
            _set_aliases(version, aliases)
        elif aliases is not None:
            version.pending_aliases = aliases
        version.save()
        if ready:  # MLflow refusing rolls the change back here too
            with _mlflow() as store:
                store.update_version(
                    version.model.name, version.version, description=description,
                    tags=None if tags is None else {k: v for k, v in tags.items()
                                                    if old_tags.get(k) != v},
                    removed_tags=[] if tags is None else [k for k in old_tags if k not in tags],
                    aliases=aliases, removed_aliases=[] if aliases is None else
                    [a for a in old_aliases if a not in aliases])
    return version


def update_model(model: RegisteredModel, user, description: str) -> RegisteredModel:
    require_writer(model, user)
    with transaction.atomic():
        model.description = description
        model.save(update_fields=["description", "updated_at"])
        if model.versions.filter(state=VersionState.READY).exists():
            with _mlflow() as store:
                store.update_model(model.name, description)
    return model


def require_writer(model: RegisteredModel, user) -> None:
    if not model.project.can_write(user):
        raise PermissionDenied("Only the project's owners and maintainers may change its models.")


def _set_aliases(version: ModelVersion, aliases: Sequence[str]) -> None:
    """Make `aliases` exactly the ready version's aliases; one held by another version moves."""
    version.aliases.exclude(name__in=aliases).delete()
    for alias in aliases:
        ModelAlias.objects.update_or_create(model=version.model, name=alias,
                                            defaults={"version": version})


def tracking():
    from experiments.mlflow_store import Tracking

    return Tracking(settings.MLFLOW_TRACKING_URI, timeout_s=60)


@contextlib.contextmanager
def _mlflow():
    """The MLflow adapter; its failure is TrackingUnavailable (the API's 503, the page's
    message), which rolls back the transaction around it."""
    from experiments.mlflow_store import TrackingError

    try:
        yield tracking()
    except TrackingError as exc:
        raise TrackingUnavailable(str(exc)) from exc


# --------------------------------------------------------------------------- the worker

def export_and_register(version_id: int) -> str:
    """Export the version's checkpoint and register it in MLflow (the worker's task); its state
    afterwards. A version that is not PENDING is left as it is (a repeated message)."""
    version = ModelVersion.objects.select_related("model", "run").filter(pk=version_id).first()
    if version is None or version.state != VersionState.PENDING:
        return version.state if version else "gone"
    try:
        _export_and_register(version)
    except Exception as exc:  # noqa: BLE001 - any failure is the version's, told to its page
        log.exception("registering %s failed", version)
        ModelVersion.objects.filter(pk=version.pk, state=VersionState.PENDING).update(
            state=VersionState.FAILED, error=_reason(exc))
        return VersionState.FAILED
    return VersionState.READY


def _export_and_register(version: ModelVersion) -> None:
    from experiments.mlflow_store import TrackingError

    run, store = version.run, tracking()
    folder = f"exported/step_{version.step}"
    Path(settings.ASCENT_RUNS_DIR).mkdir(parents=True, exist_ok=True)  # room for big models
    work = Path(tempfile.mkdtemp(prefix=".register-", dir=settings.ASCENT_RUNS_DIR))
    try:
        if not store.list_artifacts(run.mlflow_run_id, folder):
            (work / "checkpoint").mkdir()
            checkpoint = store.download(run.mlflow_run_id, f"checkpoints/step_{version.step}",
                                        work / "checkpoint")
            export(checkpoint, work / "exported")
            store.log_folder(run.mlflow_run_id, work / "exported", folder)
        try:
            lineage = read_json(run, "lineage/lineage.json")
        except TrackingUnavailable:
            lineage = None
        source = f"runs:/{run.mlflow_run_id}/{folder}"
        tags = {**version.tags, "ascent.run": str(run.pk), "ascent.step": str(version.step)}
        number = store.register_version(version.model.name, source, run.mlflow_run_id,
                                        description=version.description, tags=tags,
                                        model_description=version.model.description)
    except TrackingError as exc:
        raise DomainError(f"MLflow refused: {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)
    with transaction.atomic():
        version = ModelVersion.objects.select_for_update().select_related("model").get(
            pk=version.pk)
        version.version, version.source, version.state = number, source, VersionState.READY
        version.lineage = lineage or platform_lineage(run)
        _set_aliases(version, version.pending_aliases)
        version.pending_aliases = []
        version.save()
        aliases = version.alias_names()
    if aliases:
        store.update_version(version.model.name, number, aliases=aliases)


def export(checkpoint: str | Path, out: Path) -> None:
    """`python -m rl_core export` in its own process (torch stays out of the worker, and its
    memory goes back when it ends); DomainError with the command's last words on a failure."""
    done = subprocess.run([sys.executable, "-m", "rl_core", "export", str(checkpoint), str(out)],
                          capture_output=True, text=True, timeout=settings.ASCENT_EXPORT_TIMEOUT_S)
    if done.returncode != 0:
        words = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise DomainError(f"exporting the checkpoint failed (exit status {done.returncode}): "
                          + " ".join(words))


def platform_lineage(run: Run) -> dict:
    """What the platform knows of a run that recorded no lineage (before rl_core did): its spec
    and data file names, without content hashes."""
    data = (run.spec or {}).get("data") or {}
    files = [{"split": split, "path": path, "bytes": None, "sha256": None}
             for split in ("train", "val") for path in data.get(f"{split}_files") or []]
    return {"format": 0, "note": "the run recorded no lineage: file hashes are unknown",
            "run": {"name": run.name, "mlflow_run_id": run.mlflow_run_id,
                    "platform_run_id": run.pk},
            "model": {"path": (run.spec or {}).get("model", {}).get("path"), "registered": None},
            "data": {"files": files, "synthetic": data.get("synthetic")},
            "code": {}, "spec": run.spec}


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text[:2000]
