"""Stopping a training run at a step boundary, with a checkpoint.

A platform stops a run's job with SIGTERM (a cancel, or a preemption that makes room for a more
urgent run) and kills it after a grace period. `python -m rl_core train` answers the first
SIGTERM by calling `request()`: the step in progress finishes, `Controller.fit` saves a
checkpoint of it and raises `Stopped`, and the command exits with status 143 naming the
checkpoint, from which a restart (`trainer.resume_mode: auto`) goes on exactly: no step lost and
none repeated. A second SIGTERM stops at once, as does a SIGTERM before the first step begins
(nothing would be saved).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

_requested = threading.Event()
_handler: Callable | None = None  # the SIGTERM handler of the command, while it runs


class Stopped(BaseException):
    """The run stopped as asked, after saving `checkpoint` (None: before its first step)."""

    def __init__(self, step: int, checkpoint: str | None):
        self.step, self.checkpoint = step, checkpoint
        where = f"checkpoint {checkpoint} saved" if checkpoint else "before its first step"
        super().__init__(f"stopped at step {step}: {where}")


def request() -> None:
    """Ask the run to stop after the step in progress."""
    _requested.set()


def requested() -> bool:
    return _requested.is_set()


def clear() -> None:
    """Forget a request (a new run in the same process)."""
    _requested.clear()


def set_handler(handler: Callable | None) -> None:
    """Make `handler` this process's SIGTERM handler (None: forget it); main thread only."""
    global _handler
    _handler = handler


def restore_handler() -> None:
    """Put the command's SIGTERM handler back: `ray.init` installs Ray's own (it exits at
    once), which would leave the step unsaved."""
    if _handler is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _handler)
