"""Per-user slots for long-lived log streams, kept in Django's cache so every web process
shares them; a slot left by a crashed process frees itself when its cache entry expires."""

from __future__ import annotations

import math
import secrets
import time

from django.conf import settings
from django.core.cache import cache
from rest_framework.exceptions import APIException

# A slot outlives its stream's time limit by this much, then expires whatever happened.
SLOT_MARGIN_S = 60


class TooManyStreams(APIException):
    """429 with Retry-After: the user already holds every stream slot."""

    status_code = 429
    default_code = "throttled"

    def __init__(self, open_: int, limit: int, wait: int):
        super().__init__(
            f"You already have {open_} log stream{'' if open_ == 1 else 's'} open and the limit "
            f"is {limit} per user "
            f"(ASCENT_LOG_STREAMS_PER_USER): close a run page or another stream, or retry in "
            f"{wait} s.")
        self.wait = wait


class Slot:
    """One stream slot of a user; `release()` is idempotent."""

    def __init__(self, key: str, token: str):
        self.key, self.token, self.released = key, token, False

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        held = cache.get(self.key)
        if held and held["token"] == self.token:  # not a slot that expired and was taken again
            cache.delete(self.key)


def slot_keys(user_id: int, limit: int) -> list[str]:
    """The cache keys of a user's first `limit` slots."""
    return [f"ascent:log-stream:{user_id}:{index}" for index in range(limit)]


def acquire(user_id: int) -> Slot:
    """A free slot of the user, or TooManyStreams naming how many are open and the limit."""
    limit = settings.ASCENT_LOG_STREAMS_PER_USER
    timeout = settings.ASCENT_LOG_STREAM_LIMIT_S + SLOT_MARGIN_S
    token = secrets.token_hex(8)
    for key in slot_keys(user_id, limit):
        if cache.add(key, {"token": token, "until": time.time() + timeout}, timeout=timeout):
            return Slot(key, token)
    held = cache.get_many(slot_keys(user_id, limit)).values()
    soonest = min((h["until"] - SLOT_MARGIN_S for h in held), default=time.time())
    raise TooManyStreams(len(held), limit, max(1, math.ceil(soonest - time.time())))
