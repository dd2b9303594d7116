"""What a run produced: its job logs (stored by the worker), and its metrics and artifacts (read
from MLflow through workers.tracking). Also a cluster's utilisation."""

from __future__ import annotations

import json
import re
import time

from django.conf import settings
from django.http import StreamingHttpResponse
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.renderers import BaseRenderer

from clusters.models import Cluster
from clusters.services import cluster_capacity
from experiments.choices import ACTIVE_STATES
from experiments.models import Attempt, Run

# A follow stream ends after this long even if the run goes on (the client reconnects with
# the offset of its last event); a stream per watcher must not hold a web worker forever.
FOLLOW_LIMIT_S = 300
FOLLOW_POLL_S = 1.0
_STEP = re.compile(r"^checkpoints/step_(\d+)$")


class TrackingUnavailable(APIException):
    status_code = 503
    default_detail = "The metrics store (MLflow) cannot be reached; try again shortly."
    default_code = "tracking_unavailable"


def _attempt(run: Run, number: int | None) -> Attempt | None:
    attempts = run.attempts.order_by("-number")
    if number is None:
        return attempts.first()
    attempt = attempts.filter(number=number).first()
    if attempt is None:
        raise ValidationError({"attempt": [f"run {run.pk} has no attempt {number}"]})
    return attempt


def _int(params, name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValidationError({name: [f"must be an integer, got {raw!r}"]}) from None
    if value < minimum:
        raise ValidationError({name: [f"must be at least {minimum}"]})
    return value


def log_page(run: Run, params) -> dict:
    """The attempt's log text after `offset` (characters), as the worker stored it."""
    attempt = _attempt(run, _int(params, "attempt", None, minimum=1))
    offset = _int(params, "offset", 0)
    if attempt is None:
        return {"attempt": None, "offset": 0, "text": "", "complete": run.is_terminal}
    text, end = _read(attempt, offset)
    return {"attempt": attempt.number, "offset": end, "text": text,
            "complete": attempt.ended_at is not None and end >= attempt.log_offset}


def _read(attempt: Attempt, offset: int) -> tuple[str, int]:
    parts, end = [], offset
    for start, text in attempt.log_chunks.filter(offset__gte=offset - 1_000_000).order_by(
            "offset").values_list("offset", "text"):
        stop = start + len(text)
        if stop <= end:
            continue
        parts.append(text[max(0, end - start):])
        end = stop
    return "".join(parts), end


class EventStreamRenderer(BaseRenderer):
    """Lets content negotiation accept `Accept: text/event-stream` (browsers' EventSource sends
    it); the stream itself is a StreamingHttpResponse, so nothing is rendered here. Errors
    before the stream starts (404, 403) come out as JSON text."""

    media_type = "text/event-stream"
    format = "event-stream"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return json.dumps(data).encode()


def follow_logs(run: Run, params) -> StreamingHttpResponse:
    """Server-sent events: `log` events with {"offset", "text"} as text arrives, then `end`."""
    first = log_page(run, params)

    def events():
        page, deadline = first, time.monotonic() + FOLLOW_LIMIT_S
        while True:
            if page["text"]:
                yield _event("log", {"attempt": page["attempt"], "offset": page["offset"],
                                     "text": page["text"]})
            run.refresh_from_db(fields=["state"])
            if page["complete"] and run.is_terminal or time.monotonic() > deadline:
                yield _event("end", {"attempt": page["attempt"], "offset": page["offset"],
                                     "state": run.state})
                return
            if not page["text"]:
                yield ": keep-alive\n\n"  # a comment line: keeps proxies from closing the stream
            time.sleep(FOLLOW_POLL_S)
            latest = _attempt(run, None)
            if latest is not None and latest.number != page["attempt"]:  # a new attempt: from 0
                page = log_page(run, {"attempt": latest.number, "offset": 0})
            else:
                page = log_page(run, {"attempt": page["attempt"], "offset": page["offset"]}
                                if page["attempt"] else {})

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def _tracking():
    from workers.tracking import Tracking, TrackingError

    return Tracking(settings.MLFLOW_TRACKING_URI), TrackingError


def metrics(run: Run, params) -> dict:
    """Metric keys, latest values and (for `keys=a,b`) histories down-sampled to `max_points`."""
    keys = [k for k in (params.get("keys") or "").split(",") if k]
    max_points = _int(params, "max_points", 500, minimum=2)
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


def compare(runs: list[Run], keys: list[str], max_points: int = 500) -> dict:
    """What the compare page needs from MLflow: every metric name the runs logged, the
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


def utilisation(cluster: Cluster) -> dict:
    capacity = cluster_capacity(cluster)
    runs = Run.objects.filter(cluster=cluster, state__in=ACTIVE_STATES).order_by("created_at")
    return {
        "cluster": cluster.name, "status": cluster.status, "last_probe_at": cluster.last_probe_at,
        "last_probe_error": cluster.last_probe_error,
        "kinds": {kind: {**c.as_dict(), "utilisation": (c.held / c.healthy) if c.healthy else 0.0}
                  for kind, c in capacity.items()},
        "runs": [{"id": r.pk, "name": r.name, "state": r.state, "device_type": r.device_type,
                  "device_count": r.device_count} for r in runs],
    }
