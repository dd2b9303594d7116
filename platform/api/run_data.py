"""What a run produced, for the API: its job logs (stored by the worker) and its metrics (read
from MLflow by experiments.tracking). Also a cluster's utilisation."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db.models import Count, Sum
from django.db.models.functions import Coalesce
from django.http import StreamingHttpResponse
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer

from accounts.queries import visible_projects
from api import stream_slots
from clusters.models import Cluster
from clusters.services import cluster_capacity
from experiments import tracking
from experiments.choices import ACTIVE_STATES
from experiments.models import Attempt, Run

# A follow stream reads the log this often; it ends after ASCENT_LOG_STREAM_LIMIT_S even if the
# run goes on (the client reconnects with the offset of its last event).
FOLLOW_POLL_S = 1.0


def _attempt(run: Run, number: int | None) -> Attempt | None:
    attempts = run.attempts.order_by("-number")
    if number is None:
        return attempts.first()
    attempt = attempts.filter(number=number).first()
    if attempt is None:
        raise ValidationError({"attempt": [f"run {run.pk} has no attempt {number}"]})
    return attempt


# Bounds of the query parameters (the OpenAPI document says the same, api/views.py).
ATTEMPT_MAX = 2**31 - 1
OFFSET_MAX = 2**62  # characters; PostgreSQL's bigint holds the offset arithmetic of _read
MAX_POINTS_MAX = 10_000


def _int(params, name: str, default: int | None, minimum: int, maximum: int) -> int | None:
    """A whole-number parameter in ASCII digits (int() would also take "+1", " 1", "1_0" and
    other scripts' digits) within [minimum, maximum], or a 400 naming it."""
    raw = params.get(name)
    if raw in (None, ""):
        return default
    raw = str(raw)  # the follow stream passes its own numbers
    if not (raw.isascii() and raw.isdigit()) or not minimum <= int(raw) <= maximum:
        raise ValidationError({name: [
            f"must be a whole number from {minimum} to {maximum}, got {raw[:40]!r}"]})
    return int(raw)


def log_page(run: Run, params) -> dict:
    """The attempt's log text after `offset` (characters), as the worker stored it."""
    attempt = _attempt(run, _int(params, "attempt", None, 1, ATTEMPT_MAX))
    offset = _int(params, "offset", 0, 0, OFFSET_MAX)
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


def follow_logs(run: Run, request) -> StreamingHttpResponse:
    """Server-sent events: `log` events with {"offset", "text"} as text arrives, a `: keep-alive`
    comment after ASCENT_LOG_STREAM_HEARTBEAT_S quiet seconds, then `end` when the run is over
    or the stream's time limit is reached. Holds one of the user's stream slots and one of the
    service's while open (api.stream_slots).
    Under ASGI the stream is an async generator (no thread held between polls); under WSGI a
    plain generator (Django would buffer an async one whole)."""
    follow = _Follow(run, log_page(run, request.query_params))
    is_asgi = isinstance(getattr(request, "_request", request), ASGIRequest)
    slot = stream_slots.acquire(request.user.pk, sync=not is_asgi)
    events = _async_events(follow, slot) if is_asgi else _sync_events(follow, slot)
    response = _LogStreamResponse(events, slot, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


class _LogStreamResponse(StreamingHttpResponse):
    """Frees the stream slot when the server closes the response, even if the stream never
    started or its client went away while a chunk was being sent."""

    def __init__(self, events, slot: stream_slots.Slot, **kwargs):
        super().__init__(events, **kwargs)
        self.slot = slot

    def close(self):
        self.slot.release()
        super().close()


class _Follow:
    """What a follow stream sends next; `step()` reads the database (call it from a thread
    under ASGI), `pause()` says how long to wait before the next step."""

    def __init__(self, run: Run, first: dict):
        self.run, self.page, self.fresh = run, first, True
        now = time.monotonic()
        self.deadline = now + settings.ASCENT_LOG_STREAM_LIMIT_S
        self.heartbeat = settings.ASCENT_LOG_STREAM_HEARTBEAT_S
        self.last_sent = now - self.heartbeat  # a comment at once when there is no text yet

    def step(self) -> tuple[list[str], bool]:
        """The chunks to send now, and whether the stream is over."""
        if not self.fresh:
            self.page = self._next_page()
        self.fresh, page, out = False, self.page, []
        if page["text"]:
            out.append(_event("log", {"attempt": page["attempt"], "offset": page["offset"],
                                      "text": page["text"]}))
        self.run.refresh_from_db(fields=["state"])
        now = time.monotonic()
        done = page["complete"] and self.run.is_terminal or now >= self.deadline
        if done:
            out.append(_event("end", {"attempt": page["attempt"], "offset": page["offset"],
                                      "state": self.run.state}))
        elif not out and now - self.last_sent >= self.heartbeat:
            out.append(": keep-alive\n\n")  # a comment line: keeps proxies from closing it
        if out:
            self.last_sent = now
        return out, done

    def pause(self) -> float:
        now = time.monotonic()
        return max(0.01, min(FOLLOW_POLL_S, self.last_sent + self.heartbeat - now,
                             self.deadline - now))

    def _next_page(self) -> dict:
        latest = _attempt(self.run, None)
        if latest is not None and latest.number != self.page["attempt"]:  # a new attempt: from 0
            return log_page(self.run, {"attempt": latest.number, "offset": 0})
        return log_page(self.run, {"attempt": self.page["attempt"], "offset": self.page["offset"]}
                        if self.page["attempt"] else {})


def _sync_events(follow: _Follow, slot: stream_slots.Slot) -> Iterator[str]:
    try:
        while True:
            out, done = follow.step()
            yield from out
            if done:
                return
            time.sleep(follow.pause())
    finally:
        slot.release()


async def _async_events(follow: _Follow, slot: stream_slots.Slot) -> AsyncIterator[str]:
    step = sync_to_async(follow.step)
    try:
        while True:
            out, done = await step()
            for chunk in out:
                yield chunk
            if done:
                return
            await asyncio.sleep(follow.pause())
    finally:
        await sync_to_async(slot.release)()


def _event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n"


def metrics(run: Run, params) -> dict:
    """Metric keys, latest values and (for `keys=a,b`) histories down-sampled to `max_points`."""
    keys = [k for k in (params.get("keys") or "").split(",") if k]
    return tracking.run_metrics(run, keys, _int(params, "max_points", 500, 2, MAX_POINTS_MAX))


def utilisation(cluster: Cluster, user) -> dict:
    """Capacity per device kind and the active runs on the cluster: the runs of projects `user`
    can see by name, the others only as a count of runs and of the devices they hold."""
    capacity = cluster_capacity(cluster)
    active = Run.objects.filter(cluster=cluster, state__in=ACTIVE_STATES)
    visible = active.filter(experiment__project__in=visible_projects(user))
    others = active.exclude(pk__in=visible.values("pk")).aggregate(
        count=Count("pk"), device_count=Coalesce(Sum("device_count"), 0))
    return {
        "cluster": cluster.name, "status": cluster.status, "last_probe_at": cluster.last_probe_at,
        "last_probe_error": cluster.last_probe_error,
        "kinds": {kind: {**c.as_dict(), "utilisation": (c.held / c.healthy) if c.healthy else 0.0}
                  for kind, c in capacity.items()},
        "runs": [{"id": r.pk, "name": r.name, "state": r.state, "device_type": r.device_type,
                  "device_count": r.device_count} for r in visible.order_by("created_at")],
        "other_runs": others,
    }
