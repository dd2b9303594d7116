"""The run states and the transitions allowed between them (design.md, "Run lifecycle")."""

from django.db import models


class RunState(models.TextChoices):
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


S = RunState
TERMINAL_STATES = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
# States in which a run may hold devices on a cluster.
ACTIVE_STATES = frozenset({S.SCHEDULED, S.STARTING, S.RUNNING, S.RESTARTING, S.CANCELLING})

TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    S.QUEUED: frozenset({S.SCHEDULED, S.CANCELLED, S.FAILED}),
    # SCHEDULED -> QUEUED: the placement was given up (node drained, cluster lost) before launch.
    S.SCHEDULED: frozenset({S.STARTING, S.QUEUED, S.CANCELLING, S.CANCELLED, S.FAILED}),
    # STARTING -> SUCCEEDED: a short job can finish before it is ever seen running.
    S.STARTING: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.RESTARTING, S.CANCELLING}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.RESTARTING, S.CANCELLING}),
    S.RESTARTING: frozenset({S.QUEUED, S.SCHEDULED, S.STARTING, S.FAILED, S.CANCELLING, S.CANCELLED}),
    # A job may finish or fail before the cancel reaches it.
    S.CANCELLING: frozenset({S.CANCELLED, S.SUCCEEDED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}


def can_transition(source: str, target: str) -> bool:
    return RunState(target) in TRANSITIONS[RunState(source)]
