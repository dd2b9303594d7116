"""The scoring process of `RewardComposer`: scores responses with the composer's functions.

Protocol on one duplex pipe. The worker sends `READY` once it has warmed up. The parent sends
`(sample, first, completion, ground_truth)`; the worker answers one
`(sample, j, score, error)` for each function j from `first` on, so the parent always knows which
function is running and since when. `None` (or a closed pipe) ends the worker.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import Any

from rl_core.rewards.registry import RewardFn

READY = "ready"


def score_one(
    fn: RewardFn, completion: str, ground_truth: Any, kwargs: Mapping[str, Any]
) -> tuple[float, str | None]:
    """(score, None), or (0.0, why) when the function raised or returned a non-finite number."""
    try:
        score = float(fn(completion, ground_truth, **kwargs))
    except Exception as error:  # a reward bug or a bad record scores 0 and is counted
        return 0.0, f"{type(error).__name__}: {error}"[:500]
    if not math.isfinite(score):
        return 0.0, f"non-finite score {score}"
    return score, None


def worker_main(conn: Connection, terms: Sequence[tuple[RewardFn, dict[str, Any]]]) -> None:
    """Serve scoring requests until told to stop or the parent goes away."""
    # The parent decides when workers end: a Ray job's stop signals the whole process tree,
    # and the step in progress (saved before the run stops: rl_core.stopping) needs them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        from rl_core.rewards.equivalence import warm_up

        warm_up()
    except Exception:  # noqa: BLE001 - warming up is an optimisation; scoring reports errors
        pass
    conn.send(READY)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        sample, first, completion, ground_truth = request
        for j in range(first, len(terms)):
            fn, kwargs = terms[j]
            conn.send((sample, j, *score_one(fn, completion, ground_truth, kwargs)))
