"""Slots for long-lived log streams, so open streams cannot exhaust the service: at most
ASCENT_LOG_STREAMS_PER_USER per user and ASCENT_LOG_STREAMS_TOTAL in all, counted in the
database so that every web process (and every host) shares them, with or without Redis. A slot
left by a crashed process frees itself when its time (the stream's limit plus a margin) is up.

A threaded (WSGI) process also serves at most ASCENT_LOG_STREAMS_PER_SYNC_PROCESS streams at
once, since each holds one of its threads for the stream's whole life: the rest stay free for
health checks and the API (streams belong on the ASGI service, docs/operations.md).
"""

from __future__ import annotations

import math
import random
import secrets
import threading
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from rest_framework.exceptions import APIException

from api.models import StreamSlot

# A slot outlives its stream's time limit by this much, then expires whatever happened.
SLOT_MARGIN_S = 60
USER_PREFIX = "user:{user_id}:"
ALL_PREFIX = "all:"


class TooManyStreams(APIException):
    """429 with Retry-After: the user (or the service) already holds every stream slot."""

    status_code = 429
    default_code = "throttled"

    def __init__(self, detail: str, wait: int):
        super().__init__(detail)
        self.wait = wait


class Slot:
    """A stream's claims (its user's slot and one of the service's); `release()` is idempotent."""

    def __init__(self, keys: list[str], token: str, on_release=None):
        self.keys, self.token, self.released, self.on_release = keys, token, False, on_release

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self.on_release is not None:
            self.on_release()
        if self.keys:  # only its own claims, not ones that expired and were taken again
            StreamSlot.objects.filter(key__in=self.keys, token=self.token).delete()


def acquire(user_id: int, *, sync: bool = False) -> Slot:
    """The user's free slot and one of the service's, or TooManyStreams naming the limit.
    `sync`: the stream would hold a thread of this (WSGI) process."""
    on_release = _SyncStreams.take() if sync else None
    try:
        now = timezone.now()
        until = now + timedelta(seconds=settings.ASCENT_LOG_STREAM_LIMIT_S + SLOT_MARGIN_S)
        token = secrets.token_hex(8)
        StreamSlot.objects.filter(expires_at__lt=now).delete()
        prefix, limit = USER_PREFIX.format(user_id=user_id), settings.ASCENT_LOG_STREAMS_PER_USER
        mine = _claim(prefix, limit, token, until)
        if mine is None:
            held = _held(prefix)
            raise TooManyStreams(
                f"You already have {len(held)} log stream{'' if len(held) == 1 else 's'} open "
                f"and the limit is {limit} per user (ASCENT_LOG_STREAMS_PER_USER): close a run "
                f"page or another stream, or retry in {_wait(held)} s.", _wait(held))
        total = settings.ASCENT_LOG_STREAMS_TOTAL
        service = _claim(ALL_PREFIX, total, token, until)
        if service is None:
            StreamSlot.objects.filter(key=mine, token=token).delete()
            wait = _wait(_held(ALL_PREFIX))
            raise TooManyStreams(
                f"The service already serves {total} log streams, its limit "
                f"(ASCENT_LOG_STREAMS_TOTAL): retry in {wait} s.", wait)
    except BaseException:
        if on_release is not None:
            on_release()
        raise
    return Slot([mine, service], token, on_release)


def _claim(prefix: str, limit: int, token: str, until) -> str | None:
    """A free key `<prefix><n>` (n < limit) claimed for `token`, or None when all are held."""
    taken = set(StreamSlot.objects.filter(key__startswith=prefix).values_list("key", flat=True))
    free = [key for key in (f"{prefix}{n}" for n in range(limit)) if key not in taken]
    random.shuffle(free)  # concurrent claims rarely try the same key
    for key in free:
        try:
            with transaction.atomic():
                StreamSlot.objects.create(key=key, token=token, expires_at=until)
            return key
        except IntegrityError:  # another process took it meanwhile
            continue
    return None


def _held(prefix: str) -> list:
    return list(StreamSlot.objects.filter(key__startswith=prefix).values_list("expires_at",
                                                                                flat=True))


def _wait(held: list) -> int:
    """Seconds until the first of these claims reaches its stream's time limit."""
    if not held:
        return 1
    soonest = min(held) - timedelta(seconds=SLOT_MARGIN_S)
    return max(1, math.ceil((soonest - timezone.now()).total_seconds()))


class _SyncStreams:
    """Streams this process serves on threads, against ASCENT_LOG_STREAMS_PER_SYNC_PROCESS."""

    lock, count = threading.Lock(), 0

    @classmethod
    def take(cls):
        limit = settings.ASCENT_LOG_STREAMS_PER_SYNC_PROCESS
        with cls.lock:
            if cls.count >= limit:
                wait = min(30, settings.ASCENT_LOG_STREAM_LIMIT_S)
                raise TooManyStreams(
                    f"This server process already serves {limit} log streams on its threads "
                    "(ASCENT_LOG_STREAMS_PER_SYNC_PROCESS), so that it can still answer other "
                    f"requests: retry in {wait} s. Serve streams with the ASGI worker "
                    "(docs/operations.md).", wait)
            cls.count += 1
        released = threading.Event()

        def give_back():
            if not released.is_set():
                released.set()
                with cls.lock:
                    cls.count -= 1

        return give_back
