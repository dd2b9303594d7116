"""Scoring a batch of responses with weighted reward functions, each call under a time limit.

    with RewardComposer(spec.reward.functions, timeout_s=spec.reward.timeout_s) as composer:
        scores = composer.score_batch(responses, answers)
        scores.total                      # [n] weighted sums
        scores.per_function["format"]     # [n] raw scores of one function
        scores.metrics()                  # {"reward/format/mean": …, "reward/timeouts": …}

Each (response, function) call has `timeout_s`: a call that overruns scores 0 and is counted in
`timeouts`; a call that raises scores 0 and is counted in `errors`. Functions run in a small pool
of worker processes (started on first use, kept between batches), where an overrunning call's
worker is killed and replaced. Processes are used because nothing else can stop a sympy
computation that never ends: signal-based limits (math-verify's own) only work in a process's
main thread, and a thread cannot be killed. Workers are forked from a forkserver that has already
loaded math-verify, so a replacement is ready in milliseconds.

The cheap built-ins (`CHEAP_REWARDS`: format, exact_match, countdown, …) run in the calling
process instead, unless their entry says `in_process: false`, since the round trip to a worker
costs more than the call. Such a call cannot be stopped: one that returns after `timeout_s` is
scored and counted exactly as a worker's timeout, and one that raises exactly as a worker's
error. `in_process: true` runs any function so, at the risk of a call that never returns.

With `remote` (`reward.remote`, see `rl_core.rewards.remote`) every response is also sent to a
reward service while the functions score it; its score, times its weight, is added to the total
and shows in `per_function["remote"]`, and `metrics()` adds the service's latency, failures and
retries. The service reads the prompt as well: callers pass `prompts` to `score_batch` (the
prompt texts, one per response); without them it is sent null.

As with any multiprocessing code, a script that scores at import time must guard its entry point
with `if __name__ == "__main__":` (the workers import the main module); `python -m rl_core`, Ray
actors and pytest need nothing.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from rl_core.rewards._worker import READY, score_one, worker_main
from rl_core.rewards.registry import CHEAP_REWARDS, RewardFn, check_kwargs, get_reward

logger = logging.getLogger(__name__)

OK, TIMEOUT, ERROR = "ok", "timeout", "error"
REMOTE = "remote"  # the remote reward's name among the per-function scores
STARTUP_TIMEOUT_S = 120.0  # a worker that is not ready by then means a broken environment
MAX_START_FAILURES = 3  # workers dying before they are ready, in a row
MAX_WARNINGS_PER_BATCH = 3
TIMED_OUT = "reward %r timed out after %.1f s on sample %d (%d chars); scored 0"
RAISED = "reward %r raised on sample %d: %s"


@dataclass(frozen=True)
class RewardTerm:
    """One resolved entry of `reward.functions`; `in_process`: scored in the calling process
    rather than by the worker pool."""

    name: str
    fn: RewardFn
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)
    in_process: bool = False


def resolve_terms(functions: Sequence[Any], allow_none: bool = False) -> list[RewardTerm]:
    """`RewardFunctionSpec`s, mappings {name, weight, kwargs, in_process} or bare names ->
    checked terms. `in_process` None (or absent) means: in process when the name is in
    `CHEAP_REWARDS`, in the pool otherwise.

    Raises UnknownRewardError for an unregistered name, TypeError for keyword arguments the
    function does not take, an `in_process` that is not a bool or None, or a pooled function
    worker processes cannot import, and ValueError for a name listed twice (its per-function
    metrics would collide) or for no functions at all (unless `allow_none`)."""
    terms: list[RewardTerm] = []
    for entry in functions:
        name = _field(entry, "name")
        weight, kwargs = _field(entry, "weight", 1.0), _field(entry, "kwargs") or {}
        in_process = _in_process(name, _field(entry, "in_process"))
        term = RewardTerm(name, get_reward(name), float(weight), dict(kwargs), in_process)
        check_kwargs(name, term.fn, term.kwargs)
        if any(t.name == name for t in terms):
            raise ValueError(f"reward function {name!r} is listed twice: list each name once")
        if not in_process:
            _check_picklable(term)
        terms.append(term)
    if not terms and not allow_none:
        raise ValueError("no reward functions: give at least one")
    return terms


def _in_process(name: str, value: Any) -> bool:
    if value is None:
        return name in CHEAP_REWARDS
    if not isinstance(value, bool):
        raise TypeError(
            f"reward function {name!r}: in_process must be true, false or null, got {value!r}"
        )
    return value


def _check_picklable(term: RewardTerm) -> None:
    try:
        pickle.dumps(term.fn)
    except Exception as error:
        raise TypeError(
            f"reward function {term.name!r} cannot be sent to a worker process ({error}): "
            "register a module-level function, or set in_process: true"
        ) from None


def _field(entry: Any, key: str, default: Any = None) -> Any:
    if isinstance(entry, str):  # a bare name: weight 1, no keyword arguments
        return entry if key == "name" else default
    if isinstance(entry, Mapping):
        return entry.get(key, default)
    return getattr(entry, key, default)


@dataclass(frozen=True)
class BatchScores:
    """Scores of one batch. `per_function` holds raw (unweighted) scores by function name;
    `total` the weighted sums; `timeouts` and `errors` count this batch's failed calls."""

    total: list[float]
    per_function: dict[str, list[float]]
    timeouts: int = 0
    errors: int = 0
    remote: dict[str, float] = field(default_factory=dict)

    def metrics(self, prefix: str = "reward") -> dict[str, float]:
        """`<prefix>/<name>/mean` for each function, `<prefix>/timeouts`, `<prefix>/errors`,
        and with a remote reward `<prefix>/remote/latency_mean_s`, `latency_max_s`,
        `failures`, `retries` and `mean`."""
        out = {
            f"{prefix}/{name}/mean": sum(values) / len(values) if values else 0.0
            for name, values in self.per_function.items()
        }
        out[f"{prefix}/timeouts"] = float(self.timeouts)
        out[f"{prefix}/errors"] = float(self.errors)
        out.update({f"{prefix}/remote/{key}": value for key, value in self.remote.items()})
        return out


class RewardComposer:
    """Weighted reward functions scored under a time limit, in process or in worker processes.

    functions: `RewardFunctionSpec`s, mappings {name, weight=1, kwargs={}, in_process=None}, or
        bare names (see `resolve_terms`).
    timeout_s: limit for one function on one response (`reward.timeout_s`).
    num_workers: worker processes (default: CPUs, at most 8); started only when some function
        is pooled.
    start_method: multiprocessing start method (default: forkserver where available, else spawn).
    remote: a reward service (`RemoteRewardConfig`, a mapping of its fields, or a
        `RemoteReward`), scored beside the functions under the name "remote"; with it the
        functions may be empty.
    `timeouts` and `errors` count failed calls since construction, `remote_failures` and
    `remote_retries` the service's. Not thread-safe to share
    between concurrent callers beyond the internal lock (calls are serialised).
    """

    def __init__(
        self,
        functions: Sequence[Any],
        *,
        timeout_s: float = 10.0,
        num_workers: int | None = None,
        start_method: str | None = None,
        remote: Any = None,
    ) -> None:
        from rl_core.rewards.remote import RemoteReward

        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if num_workers is not None and num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        self.terms = resolve_terms(functions, allow_none=remote is not None)
        if remote is not None and any(t.name == REMOTE for t in self.terms):
            raise ValueError(f"a reward function is named {REMOTE!r}, the name of the remote "
                             "reward's scores: register it under another name")
        self.remote: RemoteReward | None = (
            remote if remote is None or isinstance(remote, RemoteReward)
            else RemoteReward.from_config(remote))
        self.remote_failures = 0
        self.remote_retries = 0
        self._local = [j for j, t in enumerate(self.terms) if t.in_process]
        self._pooled = [j for j, t in enumerate(self.terms) if not t.in_process]
        self.timeout_s = float(timeout_s)
        self.num_workers = num_workers or min(8, _cpu_count())
        self.start_method = start_method or _default_start_method()
        multiprocessing.get_context(self.start_method)  # a ValueError now for an unknown method
        self.timeouts = 0
        self.errors = 0
        self._pool: _Pool | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> RewardComposer:
        """From a `RewardConfig` (`spec.reward`): its functions, timeout and remote reward."""
        return cls(config.functions, timeout_s=config.timeout_s,
                   remote=getattr(config, "remote", None), **kwargs)

    @property
    def names(self) -> list[str]:
        """The functions' names, and "remote" last with a remote reward."""
        return [t.name for t in self.terms] + ([REMOTE] if self.remote is not None else [])

    def score_batch(
        self,
        completions: Sequence[str],
        ground_truths: Sequence[Any] | None = None,
        prompts: Sequence[str | None] | None = None,
    ) -> BatchScores:
        """Score each completion against its ground truth with every function (and the remote
        reward, which is also sent `prompts`: the prompt text of each completion, or None)."""
        truths = [None] * len(completions) if ground_truths is None else list(ground_truths)
        if len(truths) != len(completions):
            raise ValueError(
                f"{len(completions)} completions but {len(truths)} ground truths: give one each"
            )
        with self._lock:
            pending = None
            if self.remote is not None and completions:
                pending = self.remote.submit(prompts, list(completions), truths)
            try:
                scores = self._collect(*self._score(list(completions), truths))
            except BaseException:
                if pending is not None:
                    for future in pending:
                        future.cancel()
                raise
            if self.remote is None:
                return scores
            return self._add_remote(scores, self.remote.collect(pending or []), len(truths))

    def _add_remote(self, scores: BatchScores, batch: Any, n: int) -> BatchScores:
        assert self.remote is not None
        self.remote_failures += batch.failures
        self.remote_retries += batch.retries
        values = batch.scores if n else []
        weight = self.remote.weight
        return BatchScores(
            total=[t + weight * v for t, v in zip(scores.total, values)],
            per_function={**scores.per_function, REMOTE: list(values)},
            timeouts=scores.timeouts,
            errors=scores.errors,
            remote={key.rsplit("/", 1)[1]: value for key, value in batch.metrics().items()},
        )

    def _score(
        self, completions: list[str], truths: list[Any]
    ) -> tuple[list[list[float]], list[list[str]]]:
        """[n][functions] scores and statuses: the in-process functions, then the pooled ones."""
        n, f = len(completions), len(self.terms)
        scores, status = [[0.0] * f for _ in range(n)], [[OK] * f for _ in range(n)]
        warnings = _Warnings()
        if completions and self._local:
            local = [self.terms[j] for j in self._local]
            part = _score_in_process(local, completions, truths, self.timeout_s, warnings)
            _place(scores, status, self._local, part)
        if completions and self._pooled:
            _place(scores, status, self._pooled, self._score_pooled(completions, truths, warnings))
        warnings.summarise()
        return scores, status

    def _score_pooled(
        self, completions: list[str], truths: list[Any], warnings: _Warnings
    ) -> tuple[list[list[float]], list[list[str]]]:
        if self._pool is None:
            pooled = [self.terms[j] for j in self._pooled]
            self._pool = _Pool(pooled, self.num_workers, self.start_method)
        try:
            return self._pool.run(completions, truths, self.timeout_s, warnings)
        except BaseException:
            # interrupted mid-batch: workers may still be busy with this batch's calls
            self._pool.close()
            self._pool = None
            raise

    def _collect(self, scores: list[list[float]], status: list[list[str]]) -> BatchScores:
        flat = [s for row in status for s in row]
        timeouts, errors = flat.count(TIMEOUT), flat.count(ERROR)
        self.timeouts += timeouts
        self.errors += errors
        weights = [t.weight for t in self.terms]
        return BatchScores(
            total=[sum(w * s for w, s in zip(weights, row)) for row in scores],
            per_function={t.name: [row[j] for row in scores] for j, t in enumerate(self.terms)},
            timeouts=timeouts,
            errors=errors,
        )

    def close(self) -> None:
        """Stop the worker processes and the remote reward's threads (the composer starts them
        again if used again)."""
        with self._lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None
            if self.remote is not None:
                self.remote.close()

    def __enter__(self) -> RewardComposer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _place(
    scores: list[list[float]],
    status: list[list[str]],
    columns: list[int],
    part: tuple[list[list[float]], list[list[str]]],
) -> None:
    """Write `part` (n rows, one column per entry of `columns`) into columns `columns` of the
    batch's [n][functions] `scores` and `status`."""
    for i, (row_scores, row_status) in enumerate(zip(*part)):
        for k, j in enumerate(columns):
            scores[i][j], status[i][j] = row_scores[k], row_status[k]


def _cpu_count() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _default_start_method() -> str:
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


class _Warnings:
    """A batch's failure warnings: the first MAX_WARNINGS_PER_BATCH are logged, then a count."""

    def __init__(self) -> None:
        self.count = 0

    def warn(self, message: str, *args: Any) -> None:
        self.count += 1
        if self.count <= MAX_WARNINGS_PER_BATCH:
            logger.warning(message, *args)

    def summarise(self) -> None:
        if self.count > MAX_WARNINGS_PER_BATCH:
            logger.warning(
                "%d more reward calls failed in this batch", self.count - MAX_WARNINGS_PER_BATCH
            )


# --------------------------------------------------------------------------- in process


def _score_in_process(
    terms: Sequence[RewardTerm],
    completions: Sequence[str],
    truths: Sequence[Any],
    timeout_s: float,
    warnings: _Warnings,
) -> tuple[list[list[float]], list[list[str]]]:
    """[n][len(terms)] scores and statuses of every term on every completion, in this process.

    Scored by the worker's own `score_one`, so a call that raises or returns a non-finite number
    is an ERROR scoring 0, as in a worker. A call cannot be stopped here: one that returns after
    `timeout_s` (whatever it returned) is a TIMEOUT scoring 0, as if a worker had been killed.
    """
    scores = [[0.0] * len(terms) for _ in completions]
    status = [[OK] * len(terms) for _ in completions]
    for i, (completion, truth) in enumerate(zip(completions, truths)):
        for k, term in enumerate(terms):
            start = time.monotonic()
            score, error = score_one(term.fn, completion, truth, term.kwargs)
            if time.monotonic() - start > timeout_s:
                warnings.warn(TIMED_OUT, term.name, timeout_s, i, len(completion))
                status[i][k] = TIMEOUT
            elif error is not None:
                warnings.warn(RAISED, term.name, i, error)
                status[i][k] = ERROR
            else:
                scores[i][k] = score
    return scores, status


# --------------------------------------------------------------------------- worker pool


class _Worker:
    """One worker process and what it is doing: sample `sample`, function `fn_index`, since."""

    def __init__(self, ctx: Any, payload: list[tuple[RewardFn, dict[str, Any]]]) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=worker_main, args=(child, payload), name="ascent-reward-worker", daemon=True
        )
        self.process.start()
        child.close()
        self.born = time.monotonic()
        self.ready = False
        self.sample: int | None = None
        self.fn_index = 0
        self.since = 0.0

    def assign(self, sample: int, first: int, completion: str, truth: Any) -> None:
        self.conn.send((sample, first, completion, truth))
        self.sample, self.fn_index, self.since = sample, first, time.monotonic()

    def ask_to_stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass

    def stop(self, grace_s: float = 0.0) -> None:
        """Wait up to `grace_s` for the process to end, then kill it."""
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5.0)
        self.conn.close()


@dataclass
class _Batch:
    completions: list[str]
    truths: list[Any]
    num_terms: int
    scores: list[list[float]] = field(init=False)
    status: list[list[str]] = field(init=False)
    warnings: _Warnings
    pending: deque[tuple[int, int]] = field(init=False)
    remaining: int = field(init=False)

    def __post_init__(self) -> None:
        n, f = len(self.completions), self.num_terms
        self.scores = [[0.0] * f for _ in range(n)]
        self.status = [[OK] * f for _ in range(n)]
        self.pending = deque((i, 0) for i in range(n))
        self.remaining = n * f

    def record(self, sample: int, j: int, score: float, status: str) -> None:
        self.scores[sample][j], self.status[sample][j] = score, status
        self.remaining -= 1


class _Pool:
    """Worker processes with a per-call deadline; a stuck or dead worker is replaced."""

    def __init__(self, terms: list[RewardTerm], size: int, start_method: str) -> None:
        self.terms = terms
        self.ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self.ctx.set_forkserver_preload(["rl_core.rewards._preload"])
        self.payload = [(t.fn, t.kwargs) for t in terms]
        self.workers = [_Worker(self.ctx, self.payload) for _ in range(size)]
        self.start_failures = 0
        self._finalizer = weakref.finalize(self, _stop_all, self.workers)

    def run(
        self, completions: list[str], truths: list[Any], timeout_s: float, warnings: _Warnings
    ) -> tuple[list[list[float]], list[list[str]]]:
        """[n][len(terms)] scores and statuses; failures are reported to `warnings`."""
        batch = _Batch(completions, truths, len(self.terms), warnings)
        while batch.remaining:
            self._dispatch(batch)
            self._receive(batch, self._wait_time(timeout_s))
            self._expire(batch, timeout_s)
        return batch.scores, batch.status

    def _dispatch(self, batch: _Batch) -> None:
        for worker in list(self.workers):
            if not batch.pending:
                return
            if worker.ready and worker.sample is None:
                sample, first = batch.pending.popleft()
                try:
                    worker.assign(sample, first, batch.completions[sample], batch.truths[sample])
                except OSError:  # died while idle: not this sample's fault
                    batch.pending.appendleft((sample, first))
                    worker.sample = None
                    self._replace(worker)

    def _wait_time(self, timeout_s: float) -> float:
        now = time.monotonic()
        deadlines = [w.since + timeout_s for w in self.workers if w.sample is not None]
        deadlines += [w.born + STARTUP_TIMEOUT_S for w in self.workers if not w.ready]
        return max(0.0, min(deadlines, default=now + 1.0) - now)

    def _receive(self, batch: _Batch, wait_s: float) -> None:
        by_conn = {w.conn: w for w in self.workers}
        for conn in wait(list(by_conn), timeout=wait_s):
            worker = by_conn[conn]
            try:
                while conn.poll():
                    self._handle(worker, conn.recv(), batch)
            except (EOFError, OSError):
                self._died(worker, batch)

    def _handle(self, worker: _Worker, message: Any, batch: _Batch) -> None:
        if message == READY:
            worker.ready = True
            self.start_failures = 0
            return
        sample, j, score, error = message
        batch.record(sample, j, score, OK if error is None else ERROR)
        if error is not None:
            batch.warnings.warn(RAISED, self.terms[j].name, sample, error)
        if j + 1 < len(self.terms):
            worker.fn_index, worker.since = j + 1, time.monotonic()
        else:
            worker.sample = None

    def _expire(self, batch: _Batch, timeout_s: float) -> None:
        now = time.monotonic()
        for worker in list(self.workers):
            if not worker.ready and now - worker.born > STARTUP_TIMEOUT_S:
                raise RuntimeError(
                    f"a reward worker did not start within {STARTUP_TIMEOUT_S:.0f} s"
                )
            if worker.sample is not None and now - worker.since > timeout_s:
                sample, j = worker.sample, worker.fn_index
                batch.warnings.warn(
                    TIMED_OUT, self.terms[j].name, timeout_s, sample, len(batch.completions[sample])
                )
                self._fail_current(worker, batch, TIMEOUT)
                self._replace(worker)

    def _died(self, worker: _Worker, batch: _Batch) -> None:
        worker.process.join(1.0)
        code = worker.process.exitcode
        if not worker.ready:
            self.start_failures += 1
            if self.start_failures >= MAX_START_FAILURES:
                raise RuntimeError(f"reward workers exit before they are ready (exit code {code})")
        elif worker.sample is not None:
            batch.warnings.warn(
                "reward worker died (exit code %s) on sample %d", code, worker.sample
            )
            self._fail_current(worker, batch, ERROR)
        self._replace(worker)

    def _fail_current(self, worker: _Worker, batch: _Batch, status: str) -> None:
        """Score the running call 0 with `status`; the sample's later functions go back in line."""
        sample, j = worker.sample, worker.fn_index
        assert sample is not None
        batch.record(sample, j, 0.0, status)
        if j + 1 < len(self.terms):
            batch.pending.appendleft((sample, j + 1))
        worker.sample = None

    def _replace(self, worker: _Worker) -> None:
        worker.stop()
        self.workers[self.workers.index(worker)] = _Worker(self.ctx, self.payload)

    def close(self) -> None:
        self._finalizer()


def _stop_all(workers: list[_Worker]) -> None:
    """Ask every worker to end, give them a second together, kill the rest."""
    for worker in workers:
        worker.ask_to_stop()
    deadline = time.monotonic() + 1.0
    for worker in workers:
        worker.stop(grace_s=max(0.0, deadline - time.monotonic()))
