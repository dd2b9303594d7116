"""The one adapter to the MLflow tracking server: experiments, runs, metric history, artifacts.

Training processes log with MLflow's own client (rl_core.tracking); the platform creates the
experiment and the run beforehand and reads them back through this module. Any failure becomes
TrackingError, whose message says whether the server could not be reached or what it refused.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from urllib.parse import quote

import requests
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")

Point = tuple[int, float, int]  # (step, value, timestamp in ms)


class TrackingError(Exception):
    """The tracking server cannot be reached, or refused a call: the message says which."""


class Tracking:
    """Experiments and runs on one MLflow tracking server, e.g. `http://mlflow:5000`.

    MLflow retries an unreachable server for minutes by default; during these calls each
    request is bounded by `timeout_s` and retried `max_retries` times, unless the operator set
    MLFLOW_HTTP_REQUEST_TIMEOUT / MLFLOW_HTTP_REQUEST_MAX_RETRIES, which win.
    """

    def __init__(self, tracking_uri: str, *, timeout_s: float = 10.0, max_retries: int = 2):
        self.uri = tracking_uri.rstrip("/")
        self._limits = {
            "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, math.ceil(timeout_s))),
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(max_retries),
            "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        }
        self._client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)

    def ensure_experiment(self, name: str, tags: Mapping[str, str] | None = None) -> str:
        """The id of the experiment with this name, created (or restored, if deleted) when
        needed, with `tags` set on it. Safe to call again and from several workers at once."""
        with self._errors(f"create experiment {name!r}"):
            found = self._client.get_experiment_by_name(name)
            if found is None:
                try:
                    return self._client.create_experiment(name, tags=dict(tags or {}))
                except MlflowException as exc:  # another worker created it meanwhile
                    if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                        raise
                    found = self._client.get_experiment_by_name(name)
            if found.lifecycle_stage == "deleted":
                self._client.restore_experiment(found.experiment_id)
            for key, value in (tags or {}).items():
                if found.tags.get(key) != value:
                    self._client.set_experiment_tag(found.experiment_id, key, value)
            return found.experiment_id

    def create_run(
        self, experiment_id: str, run_name: str, tags: Mapping[str, str] | None = None
    ) -> str:
        """A new run in RUNNING state; returns its id (the training process logs into it)."""
        with self._errors(f"create run {run_name!r}"):
            run = self._client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {}))
            return run.info.run_id

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        """Set (or overwrite) tags of the run, in one request."""
        from mlflow.entities import RunTag

        with self._errors(f"set the tags of run {run_id}"):
            self._client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def set_terminated(self, run_id: str, status: str = "FINISHED") -> None:
        """End the run with one of TERMINAL_STATUSES."""
        if status not in TERMINAL_STATUSES:
            expected = ", ".join(TERMINAL_STATUSES)
            raise ValueError(f"status must be one of {expected}, not {status!r}")
        with self._errors(f"end run {run_id}"):
            self._client.set_terminated(run_id, status)

    def metric_history(self, run_id: str, key: str, max_points: int | None = None) -> list[Point]:
        """(step, value, timestamp) of every logged value in step order, down-sampled evenly to at
        most `max_points` (at least 2) keeping the first and the last."""
        with self._errors(f"return the history of {key!r} in run {run_id}"):
            metrics = self._client.get_metric_history(run_id, key)
        points = sorted((m.step, m.value, m.timestamp) for m in metrics)
        return downsample(points, max_points)

    def metric_keys(self, run_id: str) -> list[str]:
        """Names of the metrics the run has logged, sorted."""
        return sorted(self.latest_metrics(run_id))

    def latest_metrics(self, run_id: str) -> dict[str, float]:
        """The last logged value of each metric."""
        with self._errors(f"return run {run_id}"):
            return dict(self._client.get_run(run_id).data.metrics)

    def list_artifacts(self, run_id: str, path: str = "") -> list[dict]:
        """The run's artifacts directly under `path`: `[{"path", "is_dir", "size"}]`, size in bytes
        (None for folders); paths are relative to the run's artifact root."""
        with self._errors(f"list the artifacts of run {run_id}"):
            files = self._client.list_artifacts(run_id, path or None)
        return [{"path": f.path, "is_dir": f.is_dir, "size": f.file_size} for f in files]

    def download(self, run_id: str, path: str, folder: str | os.PathLike) -> str:
        """The run's artifact `path` (a file or a folder) copied into `folder`; returns the local
        path of the copy."""
        with self._errors(f"return artifact {path!r} of run {run_id}"):
            return self._client.download_artifacts(run_id, path, str(folder))

    def read_json(self, run_id: str, path: str):
        """The JSON artifact `path` of the run, parsed; None when the run has no such file."""
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if not any(f["path"] == path for f in self.list_artifacts(run_id, parent)):
            return None
        with tempfile.TemporaryDirectory() as folder:
            local = self.download(run_id, path, folder)
            with open(local) as f:
                return json.load(f)

    def read_bytes(self, run_id: str, path: str, max_bytes: int) -> bytes | None:
        """The bytes of the run's file artifact `path`; None when the run has no such file or
        it is larger than `max_bytes`."""
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        found = [f for f in self.list_artifacts(run_id, parent) if f["path"] == path]
        if not found or found[0]["is_dir"] or (found[0]["size"] or 0) > max_bytes:
            return None
        with tempfile.TemporaryDirectory() as folder:
            local = self.download(run_id, path, folder)
            with open(local, "rb") as f:
                return f.read(max_bytes + 1)[:max_bytes]

    def log_folder(self, run_id: str, folder: str | os.PathLike, path: str) -> None:
        """Upload the local `folder` as the run's artifact folder `path`."""
        with self._errors(f"store artifact {path!r} of run {run_id}"):
            self._client.log_artifacts(run_id, str(folder), path)

    def register_version(self, name: str, source: str, run_id: str, *, description: str = "",
                         tags: Mapping[str, str] | None = None,
                         aliases: Sequence[str] = (), model_description: str = "") -> int:
        """A new version of the registered model `name` (made when new) from `source`
        (`runs:/<run id>/<folder>`), with its description, tags and aliases; its number."""
        with self._errors(f"register a version of model {name!r}"):
            try:
                self._client.get_registered_model(name)
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                self._client.create_registered_model(name, description=model_description or None)
            version = self._client.create_model_version(
                name, source, run_id=run_id, tags=dict(tags or {}), description=description or None)
            for alias in aliases:
                self._client.set_registered_model_alias(name, alias, version.version)
            return int(version.version)

    def update_version(self, name: str, version: int, *, description: str | None = None,
                       tags: Mapping[str, str] | None = None, removed_tags: Sequence[str] = (),
                       aliases: Sequence[str] | None = None, removed_aliases: Sequence[str] = ()
                       ) -> None:
        """Change a registered version's description, tags (set and removed) and aliases."""
        with self._errors(f"update version {version} of model {name!r}"):
            if description is not None:
                self._client.update_model_version(name, str(version), description=description)
            for key, value in (tags or {}).items():
                self._client.set_model_version_tag(name, str(version), key, value)
            for key in removed_tags:
                self._client.delete_model_version_tag(name, str(version), key)
            for alias in removed_aliases:
                self._client.delete_registered_model_alias(name, alias)
            for alias in aliases or ():
                self._client.set_registered_model_alias(name, alias, str(version))

    def update_model(self, name: str, description: str) -> None:
        with self._errors(f"update model {name!r}"):
            self._client.update_registered_model(name, description=description)

    def run_url(self, run_id: str) -> str:
        """The run's page in the MLflow UI."""
        with self._errors(f"return run {run_id}"):
            experiment_id = self._client.get_run(run_id).info.experiment_id
        return f"{self.uri}/#/experiments/{experiment_id}/runs/{run_id}"

    def compare_url(self, run_ids: Sequence[str]) -> str:
        """The MLflow UI's comparison of these runs (their curves and parameters side by side)."""
        experiments = []
        for run_id in run_ids:
            with self._errors(f"return run {run_id}"):
                experiment_id = self._client.get_run(run_id).info.experiment_id
            if experiment_id not in experiments:
                experiments.append(experiment_id)
        runs, exps = (quote(json.dumps(list(ids))) for ids in (run_ids, experiments))
        return f"{self.uri}/#/compare-runs?runs={runs}&experiments={exps}"

    @contextmanager
    def _errors(self, what: str):
        try:
            with _env_defaults(self._limits):
                yield
        except (MlflowException, requests.exceptions.RequestException) as exc:
            raise TrackingError(self._message(what, exc)) from exc

    def _message(self, what: str, exc: Exception) -> str:
        text = getattr(exc, "message", None) or str(exc)
        unreachable = isinstance(exc, requests.exceptions.ConnectionError) or (
            text.startswith("API request to") and " failed with " in text
        )
        if unreachable:
            reason = "connection refused" if "refused" in text.lower() else text
            return (f"cannot reach the MLflow server at {self.uri}: {reason} — is it running, and "
                    "is MLFLOW_TRACKING_URI its address?")
        return f"the MLflow server at {self.uri} did not {what}: {text}"


def downsample(points: Sequence[Point], max_points: int | None) -> list[Point]:
    """At most `max_points` evenly spaced points (by position), always the first and the last."""
    if max_points is not None and max_points < 2:
        raise ValueError(
            f"max_points must be at least 2 to keep the first and last points, not {max_points}")
    if max_points is None or len(points) <= max_points:
        return list(points)
    last = len(points) - 1
    # Spacing last / (max_points - 1) > 1, so the rounded positions are distinct.
    return [points[round(i * last / (max_points - 1))] for i in range(max_points)]


_env_lock = threading.Lock()
_env_users = 0
_env_set: list[str] = []


@contextmanager
def _env_defaults(values: Mapping[str, str]):
    """Set environment variables that are unset while at least one caller is inside; MLflow
    reads its HTTP limits only from the environment."""
    global _env_users
    with _env_lock:
        if _env_users == 0:
            _env_set[:] = [name for name in values if name not in os.environ]
            os.environ.update({name: values[name] for name in _env_set})
        _env_users += 1
    try:
        yield
    finally:
        with _env_lock:
            _env_users -= 1
            if _env_users == 0:
                for name in _env_set:
                    os.environ.pop(name, None)
                _env_set.clear()
