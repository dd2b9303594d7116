"""The run states and the transitions allowed between them (design.md, "Run lifecycle")."""

from django.db import models


class RunState(models.TextChoices):
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    PREEMPTING = "PREEMPTING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


S = RunState
TERMINAL_STATES = frozenset({S.SUCCEEDED, S.FAILED, S.CANCELLED})
# States in which a run may hold devices on a cluster.
ACTIVE_STATES = frozenset({S.SCHEDULED, S.STARTING, S.RUNNING, S.RESTARTING, S.PREEMPTING,
                           S.CANCELLING})

TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    S.QUEUED: frozenset({S.SCHEDULED, S.CANCELLED, S.FAILED}),
    # SCHEDULED -> QUEUED: the placement was given up (node drained, cluster lost) before launch.
    S.SCHEDULED: frozenset({S.STARTING, S.QUEUED, S.CANCELLING, S.CANCELLED, S.FAILED}),
    # STARTING -> SUCCEEDED: a short job can finish before it is ever seen running.
    S.STARTING: frozenset({S.RUNNING, S.SUCCEEDED, S.FAILED, S.RESTARTING, S.PREEMPTING,
                           S.CANCELLING}),
    S.RUNNING: frozenset({S.SUCCEEDED, S.FAILED, S.RESTARTING, S.PREEMPTING, S.CANCELLING}),
    # PREEMPTING: its job was asked to stop (it saves the step in progress) for a more urgent
    # run; once it ended, the run goes back to the queue and resumes from that checkpoint.
    S.PREEMPTING: frozenset({S.QUEUED, S.SUCCEEDED, S.FAILED, S.CANCELLING}),
    S.RESTARTING: frozenset({S.QUEUED, S.SCHEDULED, S.STARTING, S.FAILED, S.CANCELLING, S.CANCELLED}),
    # A job may finish or fail before the cancel reaches it.
    S.CANCELLING: frozenset({S.CANCELLED, S.SUCCEEDED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}


class WaitingCause(models.TextChoices):
    """Why a queued run waits, in one word (the run's `waiting_reason` says it in full)."""

    CAPACITY = "capacity", "capacity"  # not enough free devices (or none of its kind)
    QUOTA = "quota", "quota"  # its project's device quota is in use
    SHARE = "share", "fair share"  # projects further below their share went first
    LIMIT = "limit", "placement limit"  # the pass placed as many runs as it may
    CLUSTER = "cluster", "cluster"  # its cluster is offline or could not be reached


def can_transition(source: str, target: str) -> bool:
    return RunState(target) in TRANSITIONS[RunState(source)]
