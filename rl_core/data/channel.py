"""The data channel between RL stages: one step's batch as named columns, consumed per stage.

    channel = DataChannel()                       # or remote_channel() for a Ray actor
    channel.new_batch(8, {"prompt_ids": prompts})  # rows 0..7
    chunk = channel.get("rollout", ["prompt_ids"], max_rows=4)       # rows [0, 1, 2, 3]
    channel.put(chunk.rows, {"response_ids": responses})              # (4, T) tensor
    drain(channel, "reward", ["response_ids"], 2, score, timeout_s=60)  # a stage's whole loop

Every stage (a name) has its own consumption state: a row is handed to each stage once, when
every column the stage needs has been written for it. Stages pull chunks of their own size and
write their outputs back as new columns, so a slow stage delays only the rows it has not written
yet (as MindSpeed RL's TransferDock).

- **Ordered mode** (the default): a stage gets the lowest ready rows, and only a run that is
  contiguous from its first unconsumed row, so it never sees row k before rows < k. Which rows
  a stage sees in which order does not depend on the order other stages wrote them in; with
  `min_rows == max_rows` the chunks themselves are always the same (0..k-1, k..2k-1, ...).
- **Unordered mode**: any ready rows, lowest first.
- **A span** (`span=(start, stop)` on `get`, `wait_get`, `fetch` and `drain`): the caller
  takes only rows in [start, stop) of the stage, and is done when those are consumed. Ranks of
  a deterministic run pull fixed spans, so which rank computes which row does not depend on
  which asked first.
- **Values.** A column holds a tensor or a list. A tensor put for n rows has first dimension n
  and is stored as n row tensors (copied: later in-place changes by the writer do not leak in).
  `get` and `column` stack the rows along dim 0, right-padding with 0 to the widest row in every
  trailing dimension when widths differ between puts (e.g. responses of each chunk padded to that
  chunk's longest). List values are stored and returned as they are (not copied).
- **Write once.** A column is written once per row; a second write is an error.

With Ray, `remote_channel()` starts the channel as an actor and `fetch`/`drain` work on the
local object and on the actor handle alike; `fetch` blocks in the channel until a write makes a
chunk ready (no busy polling) and reports how long a stage waited, which callers log as
`channel/wait_s/<stage>`. Ray is imported only by those functions.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Column = torch.Tensor | list


@dataclass
class Chunk:
    """Rows handed to a stage, with the columns it needs, each indexed by position in `rows`."""

    rows: list[int]  # global row indices, ascending
    columns: dict[str, Column]  # tensors (len(rows), ...) or lists of len(rows)

    def __len__(self) -> int:
        return len(self.rows)


def pad_stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack along a new dim 0, right-padding with 0 to the largest size in every dimension."""
    shape = tuple(max(sizes) for sizes in zip(*(t.shape for t in tensors), strict=True))
    if all(t.shape == shape for t in tensors):
        return torch.stack(list(tensors))
    out = tensors[0].new_zeros((len(tensors), *shape))  # (N, *max trailing sizes)
    for i, t in enumerate(tensors):
        out[(i, *(slice(0, n) for n in t.shape))] = t
    return out


@dataclass
class _Cursor:
    """What one stage has consumed: a flag per row, their count, and the first unconsumed row."""

    taken: bytearray
    count: int = 0
    front: int = 0  # every row below `front` is consumed

    def take(self, rows: list[int]) -> None:
        for row in rows:
            self.taken[row] = 1
        self.count += len(rows)
        while self.front < len(self.taken) and self.taken[self.front]:
            self.front += 1


class DataChannel:
    """One training step's batch as named columns, with per-stage consumption (module docstring).

    Thread-safe; as a Ray actor (`remote_channel`) its calls run one at a time.
    """

    def __init__(self, *, ordered: bool = True) -> None:
        self.ordered = ordered
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified by every write
        self._batches = 0
        self._reset(0)

    def _reset(self, num_rows: int) -> None:
        self._num_rows = num_rows
        self._data: dict[str, dict[int, Any]] = {}  # column -> row -> value (row tensor or item)
        self._kind: dict[str, tuple] = {}  # column -> ("list",) or ("tensor", dtype, row ndim)
        self._cursors: dict[str, _Cursor] = {}
        self._puts = self._gets = self._rows_out = 0

    # ------------------------------------------------------------------------------- writing

    def new_batch(self, num_rows: int, columns: Mapping[str, Column] | None = None) -> None:
        """Drop the batch and all consumption state; start rows 0..num_rows-1 with `columns`."""
        if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
            raise ValueError(f"num_rows must be a positive integer, got {num_rows!r}")
        with self._lock:
            self._reset(num_rows)
            self._batches += 1
            if columns:
                self._put(range(num_rows), columns)
            self._changed.notify_all()

    def put(self, rows: Sequence[int], columns: Mapping[str, Column]) -> None:
        """Write `columns` (new or partly written) for `rows`; nothing is written on an error."""
        with self._lock:
            self._put(rows, columns)
            self._changed.notify_all()

    def _put(self, rows: Sequence[int], columns: Mapping[str, Column]) -> None:
        rows = self._check_rows(rows, columns)
        staged = {name: self._split(name, value, rows) for name, value in columns.items()}
        for name, (kind, values) in staged.items():
            self._kind.setdefault(name, kind)
            self._data.setdefault(name, {}).update(zip(rows, values, strict=True))
        self._puts += 1

    def _check_rows(self, rows: Sequence[int], columns: Mapping[str, Column]) -> list[int]:
        rows = [int(r) for r in rows]
        for row in rows:
            if not 0 <= row < self._num_rows:
                span = (
                    f"rows 0..{self._num_rows - 1}"
                    if self._num_rows
                    else "no batch: call new_batch first"
                )
                raise ValueError(f"put {sorted(columns)}: row {row} is not in the batch ({span})")
        if len(set(rows)) != len(rows):
            twice = sorted({r for r in rows if rows.count(r) > 1})
            raise ValueError(f"put {sorted(columns)}: rows {twice} are listed more than once")
        return rows

    def _split(self, name: str, value: Column, rows: list[int]) -> tuple[tuple, list]:
        """Checks one column's values for `rows`; returns its kind and one value per row."""
        if isinstance(value, torch.Tensor):
            length = value.shape[0] if value.dim() else None
            kind = ("tensor", value.dtype, value.dim() - 1)
        elif isinstance(value, list | tuple):
            length, kind = len(value), ("list",)
        else:
            raise TypeError(
                f"column {name!r}: values must be a tensor or a list, got {type(value).__name__}"
            )
        if length != len(rows):
            got = "a 0-d tensor" if length is None else f"{length} values"
            raise ValueError(
                f"column {name!r}: {got} for {len(rows)} rows (first dimension must match)"
            )
        known = self._kind.get(name, kind)
        if known != kind:
            raise ValueError(f"column {name!r} holds {_kind_text(known)}, got {_kind_text(kind)}")
        written = self._data.get(name, {})
        for row in rows:
            if row in written:
                raise ValueError(
                    f"column {name!r} already has a value for row {row} (a column is written once per row)"
                )
        if kind[0] == "list":
            return kind, list(value)
        return kind, list(value.detach().clone().unbind(0))

    # ------------------------------------------------------------------------------- reading

    def get(
        self, stage: str, needs: Sequence[str], max_rows: int, *, min_rows: int = 1,
        span: tuple[int, int] | None = None,
    ) -> Chunk | None:
        """Up to `max_rows` rows with every column in `needs` written, not yet consumed by `stage`
        (and within `span`, when given).

        The rows become consumed by `stage`. None when fewer than `min_rows` are ready, unless
        they are all that `stage` has left (the tail). The chunk holds the `needs` columns.
        """
        _check_sizes(max_rows, min_rows)
        needs = _names(needs)
        with self._lock:
            return self._take(stage, needs, max_rows, min_rows, span)

    def wait_get(
        self, stage: str, needs: Sequence[str], max_rows: int, *, min_rows: int = 1,
        wait_s: float = 1.0, span: tuple[int, int] | None = None,
    ) -> tuple[Chunk | None, bool]:
        """`get`, waiting up to `wait_s` for a write that makes a chunk ready: (chunk, done),
        done True once `stage` has consumed every row (of `span`). Stage workers block here
        instead of polling (the Ray actor runs calls on several threads)."""
        _check_sizes(max_rows, min_rows)
        needs = _names(needs)
        deadline = time.monotonic() + wait_s
        with self._changed:
            while True:
                chunk = self._take(stage, needs, max_rows, min_rows, span)
                if chunk is not None or self._remaining(stage, span) == 0:
                    return chunk, chunk is None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None, False
                self._changed.wait(left)

    def _take(self, stage: str, needs: list[str], max_rows: int, min_rows: int,
              span: tuple[int, int] | None = None) -> Chunk | None:
        rows = self._ready_rows(stage, needs, max_rows, span)
        if not rows or len(rows) < min(min_rows, self._remaining(stage, span)):
            return None
        self._cursor(stage).take(rows)
        self._gets += 1
        self._rows_out += len(rows)
        return Chunk(rows, {name: self._gather(name, rows) for name in dict.fromkeys(needs)})

    def ready(self, stage: str, needs: Sequence[str]) -> int:
        """How many rows a `get(stage, needs, ...)` with no size limit would return now."""
        needs = _names(needs)
        with self._lock:
            return len(self._ready_rows(stage, needs, self._num_rows))

    def remaining(self, stage: str) -> int:
        """Rows of the batch not yet consumed by `stage`."""
        with self._lock:
            return self._remaining(stage)

    def done(self, stage: str) -> bool:
        """Whether `stage` has consumed every row of the batch."""
        return self.remaining(stage) == 0

    def missing(self, stage: str, needs: Sequence[str]) -> dict[str, int]:
        """For each column in `needs`: how many rows not yet consumed by `stage` lack a value."""
        needs = _names(needs)
        with self._lock:
            taken = self._cursor(stage).taken
            left = [r for r in range(self._num_rows) if not taken[r]]
            return {name: sum(r not in self._data.get(name, {}) for r in left) for name in needs}

    def column(self, name: str) -> Column:
        """The whole column, rows 0..num_rows-1; an error if any row has no value yet."""
        with self._lock:
            if name not in self._data:
                raise KeyError(f"no column {name!r}; columns: {list(self._data)}")
            lacking = self._num_rows - len(self._data[name])
            if lacking:
                raise ValueError(
                    f"column {name!r} is incomplete: {lacking} of {self._num_rows} rows have no value"
                )
            return self._gather(name, list(range(self._num_rows)))

    def columns(self) -> list[str]:
        """Column names, in the order they were first written."""
        with self._lock:
            return list(self._data)

    def stats(self) -> dict[str, float]:
        """Size and traffic of the current batch (`batches` counts since construction)."""
        with self._lock:
            tensor_bytes = sum(
                v.numel() * v.element_size()
                for name, values in self._data.items()
                if self._kind[name][0] == "tensor"
                for v in values.values()
            )
            return {
                "rows": float(self._num_rows),
                "columns": float(len(self._data)),
                "puts": float(self._puts),
                "gets": float(self._gets),
                "rows_out": float(self._rows_out),
                "tensor_bytes": float(tensor_bytes),
                "batches": float(self._batches),
            }

    def _cursor(self, stage: str) -> _Cursor:
        if stage not in self._cursors:
            self._cursors[stage] = _Cursor(bytearray(self._num_rows))
        return self._cursors[stage]

    def _remaining(self, stage: str, span: tuple[int, int] | None = None) -> int:
        if span is None:
            return self._num_rows - self._cursor(stage).count
        taken = self._cursor(stage).taken
        return sum(not taken[row] for row in range(*self._span(span)))

    def _span(self, span: tuple[int, int] | None) -> tuple[int, int]:
        if span is None:
            return 0, self._num_rows
        start, stop = span
        if not 0 <= start <= stop <= self._num_rows:
            raise ValueError(f"span {span} is not within the batch's {self._num_rows} rows")
        return start, stop

    def _ready_rows(self, stage: str, needs: list[str], limit: int,
                    span: tuple[int, int] | None = None) -> list[int]:
        cursor = self._cursor(stage)
        values = [self._data.get(name, {}) for name in needs]
        rows: list[int] = []
        start, stop = self._span(span)
        for row in range(max(cursor.front, start), stop):
            if len(rows) >= limit:
                break
            if cursor.taken[row]:
                continue
            if all(row in v for v in values):
                rows.append(row)
            elif self.ordered:
                break
        return rows

    def _gather(self, name: str, rows: list[int]) -> Column:
        values = [self._data[name][row] for row in rows]
        return pad_stack(values) if self._kind[name][0] == "tensor" else values


def _names(needs: Sequence[str]) -> list[str]:
    if isinstance(needs, str):
        raise TypeError(f"needs must be a list of column names, got the string {needs!r}")
    return list(needs)


def _check_sizes(max_rows: int, min_rows: int) -> None:
    if not 1 <= min_rows <= max_rows:
        raise ValueError(
            f"need 1 <= min_rows <= max_rows, got min_rows={min_rows}, max_rows={max_rows}"
        )


def _kind_text(kind: tuple) -> str:
    return "a list" if kind[0] == "list" else f"a tensor ({kind[1]}, {kind[2]}-d rows)"


# ----------------------------------------------------------------------------------- Ray


@functools.cache
def _actor_class():
    import ray

    # Threads: stages blocked in `wait_get` must not hold up the writes they wait for.
    return ray.remote(num_cpus=0, max_concurrency=64)(DataChannel)


def remote_channel(*, ordered: bool = True, name: str | None = None):
    """Start a DataChannel as a Ray actor (no CPUs reserved) and return its handle."""
    options = {"name": name} if name else {}
    return _actor_class().options(**options).remote(ordered=ordered)


def _is_actor(channel: Any) -> bool:
    if isinstance(channel, DataChannel):
        return False
    try:
        import ray
    except ImportError:
        ray = None
    if ray is not None and isinstance(channel, ray.actor.ActorHandle):
        return True
    raise TypeError(
        f"expected a DataChannel or a Ray actor handle of one, got {type(channel).__name__}"
    )


def call(channel: Any, method: str, *args, **kwargs) -> Any:
    """`channel.method(*args, **kwargs)` on a local channel or, through ray.get, on an actor."""
    if _is_actor(channel):
        import ray

        return ray.get(getattr(channel, method).remote(*args, **kwargs))
    return getattr(channel, method)(*args, **kwargs)


def fetch(
    channel: Any,
    stage: str,
    needs: Sequence[str],
    max_rows: int,
    *,
    timeout_s: float,
    poll_s: float = 1.0,
    min_rows: int = 1,
    span: tuple[int, int] | None = None,
) -> tuple[Chunk | None, float]:
    """Wait for `stage`'s next chunk: (chunk or None once `stage` has consumed every row, wait).

    The wait is the seconds until a chunk was ready, 0.0 when the first try answered. Waiting
    blocks in the channel (`wait_get`) until a write, at most `poll_s` per call, so the
    deadline is re-checked. Raises TimeoutError, naming the stage, the rows ready and the
    missing values, after `timeout_s` without a chunk.
    """
    needs = _names(needs)
    start = time.monotonic()
    chunk, done = call(channel, "wait_get", stage, needs, max_rows, min_rows=min_rows, wait_s=0.0,
                       span=span)
    if chunk is not None or done:
        return chunk, 0.0
    while True:
        waited = time.monotonic() - start
        if waited >= timeout_s:
            raise TimeoutError(_timeout_message(channel, stage, needs, min_rows, waited))
        chunk, done = call(channel, "wait_get", stage, needs, max_rows, min_rows=min_rows,
                            wait_s=min(timeout_s - waited, poll_s), span=span)
        if chunk is not None or done:
            return chunk, time.monotonic() - start


def _timeout_message(
    channel: Any, stage: str, needs: list[str], min_rows: int, waited: float
) -> str:
    ready, left = call(channel, "ready", stage, needs), call(channel, "remaining", stage)
    missing = call(channel, "missing", stage, needs)
    lacking = ", ".join(f"{name!r} on {n} rows" for name, n in missing.items() if n) or "none"
    return (
        f"stage {stage!r} waited {waited:.1f} s for columns {needs}: {ready} rows ready "
        f"(wants {min_rows}), {left} not yet consumed; missing values: {lacking}"
    )


def drain(
    channel: Any,
    stage: str,
    needs: Sequence[str],
    chunk_size: int,
    fn: Callable[[Chunk], Mapping[str, Column] | None],
    *,
    timeout_s: float,
    poll_s: float = 1.0,
    min_rows: int = 1,
    span: tuple[int, int] | None = None,
) -> dict[str, float]:
    """A stage's loop: fetch chunks of up to `chunk_size` rows (of `span`), write `fn(chunk)`
    back, until done.

    `fn` returns the output columns for the chunk's rows (None or {} for a stage that only reads).
    `timeout_s` bounds each wait for a chunk. Returns {"wait_s", "chunks", "rows"}.
    """
    wait_s, chunks, rows = 0.0, 0, 0
    while True:
        chunk, waited = fetch(
            channel, stage, needs, chunk_size, timeout_s=timeout_s, poll_s=poll_s, min_rows=min_rows,
            span=span)
        wait_s += waited
        if chunk is None:
            return {"wait_s": wait_s, "chunks": float(chunks), "rows": float(rows)}
        out = fn(chunk)
        if out:
            call(channel, "put", chunk.rows, out)
        chunks, rows = chunks + 1, rows + len(chunk.rows)
