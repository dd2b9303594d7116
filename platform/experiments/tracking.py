"""What a run logged to MLflow (metrics, artifacts, comparisons), read through
experiments.mlflow_store."""

from __future__ import annotations

import re

from django.conf import settings

from experiments.models import Run

_STEP = re.compile(r"^checkpoints/step_(\d+)$")


class TrackingUnavailable(Exception):
    """The metrics store (MLflow) cannot be reached or refused a read. str() is what anyone may
    read; `reason` says why and may name the store's internal address, so it is for the
    service's log and for staff. The API answers 503, the web UI shows it in place of the data."""

    PUBLIC = "The metrics store (MLflow) cannot be reached; try again shortly."

    def __init__(self, reason: str):
        super().__init__(self.PUBLIC)
        self.reason = reason

    def shown_to(self, user) -> str:
        """The reason for staff (who run the service), the public sentence for everyone else."""
        return f"MLflow did not answer: {self.reason}" if getattr(user, "is_staff", False) else str(self)


def _tracking():
    """The MLflow adapter and its error class (imported here: mlflow loads only when needed)."""
    from experiments.mlflow_store import Tracking, TrackingError

    return Tracking(settings.MLFLOW_TRACKING_URI), TrackingError


def run_metrics(run: Run, keys: list[str], max_points: int = 500) -> dict:
    """Metric keys, latest values and the histories of `keys` down-sampled to `max_points`."""
    empty = {"mlflow_run_id": run.mlflow_run_id, "mlflow_url": "", "keys": [], "latest": {},
             "history": {}}
    if not run.mlflow_run_id:
        return empty
    client, error = _tracking()
    try:
        latest = client.latest_metrics(run.mlflow_run_id)
        history = {key: [list(p) for p in client.metric_history(run.mlflow_run_id, key, max_points)]
                   for key in keys}
        url = client.run_url(run.mlflow_run_id)
    except error as exc:
        raise TrackingUnavailable(str(exc)) from exc
    return {**empty, "mlflow_url": url, "keys": sorted(latest), "latest": latest,
            "history": history}


def artifacts(run: Run) -> list[dict]:
    """The run's checkpoints (and other artifacts) in MLflow, with the run's MLflow link."""
    if not run.mlflow_run_id:
        return []
    client, error = _tracking()
    try:
        url = client.run_url(run.mlflow_run_id)
        rows = client.list_artifacts(run.mlflow_run_id)
        rows += [r for top in rows if top["is_dir"] and top["path"] == "checkpoints"
                 for r in client.list_artifacts(run.mlflow_run_id, "checkpoints")]
    except error as exc:
        raise TrackingUnavailable(str(exc)) from exc
    out = []
    for row in rows:
        match = _STEP.match(row["path"])
        out.append({**row, "step": int(match.group(1)) if match else None, "url": url})
    return out


def artifact_tree(run: Run, top: str, depth: int = 2) -> list[dict]:
    """The files under the run's artifact folder `top` (e.g. `profiles`), `depth` folders deep:
    `[{"path", "size", "url"}]` sorted by path, `url` the file in the MLflow UI; [] when the run
    logged nothing there."""
    if not run.mlflow_run_id:
        return []
    client, error = _tracking()
    files, folders = [], [(top, 0)]
    try:
        url = client.run_url(run.mlflow_run_id)
        while folders:
            folder, level = folders.pop()
            for row in client.list_artifacts(run.mlflow_run_id, folder):
                if not row["is_dir"]:
                    files.append(row)
                elif level < depth:
                    folders.append((row["path"], level + 1))
    except error as exc:
        raise TrackingUnavailable(str(exc)) from exc
    return [{"path": f["path"], "size": f["size"], "url": f"{url}/artifacts/{f['path']}"}
            for f in sorted(files, key=lambda f: f["path"])]


def read_json(run: Run, path: str):
    """The run's JSON artifact `path` (e.g. `determinism/report.json`), None when absent."""
    if not run.mlflow_run_id:
        return None
    client, error = _tracking()
    try:
        return client.read_json(run.mlflow_run_id, path)
    except error as exc:
        raise TrackingUnavailable(str(exc)) from exc


def read_bytes(run: Run, path: str, max_bytes: int) -> bytes | None:
    """The run's file artifact `path` (e.g. a sample's picture), None when absent or larger
    than `max_bytes`."""
    if not run.mlflow_run_id:
        return None
    client, error = _tracking()
    try:
        return client.read_bytes(run.mlflow_run_id, path, max_bytes)
    except error as exc:
        raise TrackingUnavailable(str(exc)) from exc


def compare(runs: list[Run], keys: list[str], max_points: int = 500) -> dict:
    """What a comparison of runs needs from MLflow: every metric name the runs logged, the
    histories of `keys` per run id, and the link to the same comparison in MLflow."""
    tracked = [run for run in runs if run.mlflow_run_id]
    if not tracked:
        return {"keys": [], "history": {}, "mlflow_url": ""}
    client, error = _tracking()
    try:
        names = sorted({key for run in tracked for key in client.latest_metrics(run.mlflow_run_id)})
        history = {run.pk: {key: [list(p) for p in
                                  client.metric_history(run.mlflow_run_id, key, max_points)]
                            for key in keys if key in names} for run in tracked}
        url = client.compare_url([run.mlflow_run_id for run in tracked])
    except error as exc:
        raise TrackingUnavailable(str(exc)) from exc
    return {"keys": names, "history": history, "mlflow_url": url}
