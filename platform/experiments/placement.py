"""Placement of queued runs onto clusters: a pure function from (queue, capacity) to decisions.

`place(queue, free, now=...)` decides, in one pass, which queued runs start where and why the
others wait. It reads nothing and writes nothing (no ORM, no clock, no I/O): the caller passes
plain dataclasses and mappings, so the rules below are tested on their own
(tests/unit/test_placement.py) and timed by bench/placement.py.

Order. A run's effective priority is `priority + aging_per_hour * hours queued` (hours counted
from `created_at` to `now`, never below zero), so a waiting run gains `aging_per_hour` every
hour and nothing starves: with the default 1.0, a run queued two hours before another of
priority one higher ranks level with it (ties go to the older run), and a run of the lowest
priority overtakes fresh runs of the highest once it has waited as many hours as the priority
range is wide (experiments.limits.PRIORITY). The queue is sorted once by effective
priority (highest first), then `created_at` (oldest first), then `id`, so the decisions do not
depend on the order of the input. Both returned lists follow that order.

Fit. Walking the ordered queue, a run fits a cluster when the cluster has at least
`device_count` free devices of the run's `device_type`. A pinned run (`cluster` set) only
considers its cluster; an unpinned one takes the best fit: the cluster that would have the
fewest free devices of that kind left after placing it, ties by cluster name. Placing a run
takes its devices from the pass's copy of `free` (the argument is never changed). Once
`max_placements` runs are placed, the rest wait.

Path policy. An unpinned run whose spec names paths that some clusters' path policies refuse
carries `allowed`, the names of the clusters that accept it (None: any cluster); it is placed,
reserves and is told why it waits only among those clusters. A pinned run was checked against its
cluster at submit.

Reservation (head-of-line fairness, only when `total` is given). When a run does not fit now
but could on some cluster whose `total` healthy devices of its kind are at least what it asks,
it reserves one such cluster for the rest of the pass: its best candidate, the one among them
with the most free devices of that kind (ties by name) that no earlier run has reserved
(a pinned run: its own cluster). Later runs cannot take devices of that kind there, so small
low-priority runs cannot keep a large high-priority run from ever fitting; devices of other
kinds on that cluster, and other clusters, stay available. Reservations last one pass: the
next pass starts from the inventory again. A run that can never fit (it asks for more than
any cluster's `total`, or more than its pinned cluster's) reserves nothing and says so. With
`total=None` nothing is reserved and never-fitting runs are not told apart.

Reasons, one per waiting run, in the first case that applies:

- "placement limit of 10 reached in this pass"
- "cluster npu-b has no capacity listed" (pinned to a cluster absent from `free` and `total`)
- "cluster npu-b has no npu devices" / "no cluster has npu devices"
- "needs 16 npu devices; cluster npu-b has 8 healthy in all" (pinned, never fits)
- "needs 16 npu devices; largest cluster: 8 healthy (npu-a)" (unpinned, never fits)
- "blocked behind higher-priority run 17 (reserving npu-a)" (it would fit there but for the
  reservation of run 17, ahead of it in the order)
- "needs 4 npu devices; cluster npu-b has 2 free" (pinned)
- "needs 8 npu devices; largest free on any cluster: 4 (npu-a)" (unpinned; over every cluster
  with devices of that kind)
- with `allowed`: "no cluster whose path policy allows this run has npu devices", and the
  largest-cluster and largest-free reasons say "... a cluster its path policy allows"

Calling it from a service. The scheduling service builds the inputs from the database and acts
on the result; this module stays free of Django:

- queue: the `experiments.models.Run` rows in state `RunState.QUEUED`, each as
  `QueuedRun(run.id, run.priority, run.created_at.timestamp(), run.device_type,
  run.device_count, run.cluster.name if run.cluster_id else None, allowed)`
  (`select_related("cluster")`), `allowed` from `clusters.services.clusters_allowing`;
- free and total: for each cluster, `caps = clusters.services.cluster_capacity(cluster)`, then
  `free[cluster.name] = {kind: cap.free for kind, cap in caps.items()}` and
  `total[cluster.name] = {kind: cap.healthy for kind, cap in caps.items()}` (healthy devices on
  ready, non-draining nodes; `free` already subtracts what active attempts hold);
- now: `time.time()` (or `timezone.now().timestamp()`), the same clock as `created_at`.

A `Placement` is a proposal: the service claims each run with a conditional UPDATE from QUEUED
to SCHEDULED and creates its attempt, skipping a run whose claim finds no row (cancelled or
claimed by another worker meanwhile); the devices it would have used are found free by the
next pass. A `Waiting` reason can be shown on the run as it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class QueuedRun:
    """A run waiting to be placed (a `Run` row in state QUEUED)."""

    id: int
    priority: int  # higher first (Run.priority, within experiments.limits.PRIORITY)
    created_at: float  # seconds since the epoch when it was queued
    device_type: str  # "npu" | "gpu" | "cpu" (clusters.choices.DeviceKind values)
    device_count: int
    cluster: str | None  # the cluster it is pinned to, or None: any cluster that fits
    # Unpinned: the clusters whose path policy allows its spec; None: every cluster.
    allowed: frozenset[str] | None = None


@dataclass(frozen=True)
class Placement:
    """Start run `run_id` on `cluster`."""

    run_id: int
    cluster: str


@dataclass(frozen=True)
class Waiting:
    """Run `run_id` stays queued, for a human-readable `reason`."""

    run_id: int
    reason: str


Capacities = Mapping[str, Mapping[str, int]]  # cluster name -> device kind -> devices


def effective_priority(run: QueuedRun, now: float, aging_per_hour: float) -> float:
    """`priority + aging_per_hour * hours queued`; a `created_at` after `now` counts as 0 h."""
    return run.priority + aging_per_hour * max(0.0, now - run.created_at) / SECONDS_PER_HOUR


def queue_order(queue: Sequence[QueuedRun], now: float, aging_per_hour: float) -> list[QueuedRun]:
    """The queue by effective priority (highest first), then created_at, then id."""
    return sorted(
        queue, key=lambda r: (-effective_priority(r, now, aging_per_hour), r.created_at, r.id)
    )


def place(
    queue: Sequence[QueuedRun],
    free: Capacities,
    *,
    now: float,
    aging_per_hour: float = 1.0,
    max_placements: int | None = None,
    total: Capacities | None = None,
) -> tuple[list[Placement], list[Waiting]]:
    """Decide where queued runs start and why the others wait (rules in the module docstring).

    free: cluster -> kind -> free devices now; total: cluster -> kind -> healthy devices, or
    None to reserve nothing. Returns (placements, waiting) in queue order; every run of the
    queue is in exactly one of them. O(n log n + n * clusters).
    """
    if aging_per_hour < 0:
        raise ValueError(f"aging_per_hour must be >= 0, got {aging_per_hour}")
    if max_placements is not None and max_placements < 0:
        raise ValueError(f"max_placements must be >= 0, got {max_placements}")
    if len({run.id for run in queue}) != len(queue):
        raise ValueError("queued run ids must be unique")
    state = _Pass(free, total)
    limit = len(queue) if max_placements is None else max_placements
    placements: list[Placement] = []
    waiting: list[Waiting] = []
    for run in queue_order(queue, now, aging_per_hour):
        if len(placements) >= limit:
            waiting.append(Waiting(run.id, f"placement limit of {limit} reached in this pass"))
            continue
        cluster = state.fit(run)
        if cluster is None:
            waiting.append(Waiting(run.id, state.wait(run)))
        else:
            placements.append(Placement(run.id, cluster))
    return placements, waiting


class _Pass:
    """The capacity bookkeeping of one `place` call, per device kind.

    open[kind]: cluster -> free devices, for the clusters not reserved for that kind, in name
    order (so a scan meets ties in name order); held[kind]: cluster -> (free devices, id of the
    run reserving it); totals[kind]: cluster -> healthy devices (only with `total`);
    largest[kind]: (most healthy devices on one cluster, that cluster; ties by name);
    most_free[kind]: (most free devices on one cluster, reserved or not, that cluster; ties by
    name), computed when asked and forgotten when a run is placed on that cluster: most runs
    that cannot fit are turned away by it without a scan.
    """

    def __init__(self, free: Capacities, total: Capacities | None):
        self.clusters = set(free) | set(total or ())
        self.reserving = total is not None
        self.open: dict[str, dict[str, int]] = {}
        self.held: dict[str, dict[str, tuple[int, int]]] = {}
        self.totals: dict[str, dict[str, int]] = {}
        self.largest: dict[str, tuple[int, str]] = {}
        self.most_free: dict[str, tuple[int, str]] = {}
        for cluster in sorted(self.clusters):
            kinds = set(free.get(cluster, ())) | set((total or {}).get(cluster, ()))
            for kind in kinds:
                self.open.setdefault(kind, {})[cluster] = free.get(cluster, {}).get(kind, 0)
                self.held.setdefault(kind, {})
                if total is not None:
                    healthy = total.get(cluster, {}).get(kind, 0)
                    self.totals.setdefault(kind, {})[cluster] = healthy
                    if healthy > self.largest.get(kind, (-1, ""))[0]:
                        self.largest[kind] = (healthy, cluster)

    def fit(self, run: QueuedRun) -> str | None:
        """Place the run if it fits: take its devices and return the cluster, else None."""
        pool = self.open.get(run.device_type)
        if not pool:
            return None
        need = run.device_count
        if run.cluster is not None:
            free = pool.get(run.cluster)
            best = run.cluster if free is not None and free >= need else None
        elif self._most_free(run.device_type)[0] < need:
            return None
        else:
            best, best_left = None, 0
            allowed = run.allowed
            for cluster, free in pool.items():  # best fit: fewest left over, ties by name
                if allowed is not None and cluster not in allowed:
                    continue
                left = free - need
                if left >= 0 and (best is None or left < best_left):
                    best, best_left = cluster, left
                    if left == 0:
                        break
        if best is not None:
            pool[best] -= need
            if self.most_free.get(run.device_type, (0, None))[1] == best:
                del self.most_free[run.device_type]  # the others only shrink: still the most
        return best

    def _most_free(self, kind: str) -> tuple[int, str]:
        if kind not in self.most_free:
            self.most_free[kind] = _most_free_of(self.open[kind], self.held[kind])
        return self.most_free[kind]

    def wait(self, run: QueuedRun) -> str:
        """Why a run that did not fit waits; reserves its best candidate when it may."""
        if run.cluster is not None:
            return self._wait_pinned(run, run.cluster)
        if run.allowed is not None:
            return self._wait_allowed(run, run.allowed)
        kind, need = run.device_type, run.device_count
        pool, held = self.open.get(kind, {}), self.held.get(kind, {})
        if not pool and not held:
            return f"no cluster has {kind} devices"
        if self.reserving:
            healthy, biggest = self.largest[kind]
            if healthy < need:
                return (
                    f"needs {need} {kind} devices; largest cluster: {healthy} healthy ({biggest})"
                )
        fits_somewhere = self._most_free(kind)[0] >= need  # then only on a reserved cluster
        blocker = _best_fit_held(held, need) if fits_somewhere else None
        self._reserve_best(run, pool)
        if blocker is not None:
            return _blocked(held, blocker)
        free, cluster = self._most_free(kind)
        return f"needs {need} {kind} devices; largest free on any cluster: {free} ({cluster})"

    def _wait_allowed(self, run: QueuedRun, allowed: frozenset[str]) -> str:
        """`wait` for an unpinned run that only the clusters in `allowed` may take."""
        kind, need = run.device_type, run.device_count
        pool = {c: n for c, n in self.open.get(kind, {}).items() if c in allowed}
        held = {c: h for c, h in self.held.get(kind, {}).items() if c in allowed}
        if not pool and not held:
            return f"no cluster whose path policy allows this run has {kind} devices"
        if self.reserving:
            least, biggest = min((-n, c) for c, n in self.totals[kind].items() if c in allowed)
            healthy = -least
            if healthy < need:
                return (f"needs {need} {kind} devices; largest cluster its path policy allows: "
                        f"{healthy} healthy ({biggest})")
        free, cluster = _most_free_of(pool, held)
        blocker = _best_fit_held(held, need) if free >= need else None
        self._reserve_best(run, pool)
        if blocker is not None:
            return _blocked(held, blocker)
        return (f"needs {need} {kind} devices; largest free on a cluster its path policy "
                f"allows: {free} ({cluster})")

    def _wait_pinned(self, run: QueuedRun, cluster: str) -> str:
        kind, need = run.device_type, run.device_count
        pool, held = self.open.get(kind, {}), self.held.get(kind, {})
        if cluster not in self.clusters:
            return f"cluster {cluster} has no capacity listed"
        if cluster not in pool and cluster not in held:
            return f"cluster {cluster} has no {kind} devices"
        if self.reserving and self.totals[kind][cluster] < need:
            healthy = self.totals[kind][cluster]
            return f"needs {need} {kind} devices; cluster {cluster} has {healthy} healthy in all"
        if cluster in held:
            free = held[cluster][0]
            if free >= need:
                return _blocked(held, cluster)
        else:
            free = pool[cluster]
            if self.reserving:
                self._reserve(run.device_type, cluster, run.id)
        return f"needs {need} {kind} devices; cluster {cluster} has {free} free"

    def _reserve_best(self, run: QueuedRun, pool: dict[str, int]) -> None:
        """Reserve the unreserved cluster with the most free devices among those whose healthy
        total could hold the run (ties by name)."""
        if not self.reserving:
            return
        totals, need = self.totals[run.device_type], run.device_count
        best, best_free = None, -1
        for cluster, free in pool.items():
            if totals[cluster] >= need and free > best_free:
                best, best_free = cluster, free
        if best is not None:
            self._reserve(run.device_type, best, run.id)

    def _reserve(self, kind: str, cluster: str, run_id: int) -> None:
        self.held[kind][cluster] = (self.open[kind].pop(cluster), run_id)


def _best_fit_held(held: dict[str, tuple[int, int]], need: int) -> str | None:
    """The reserved cluster the run would best fit on were it not reserved, or None."""
    fits = [(free - need, cluster) for cluster, (free, _) in held.items() if free >= need]
    return min(fits)[1] if fits else None


def _blocked(held: dict[str, tuple[int, int]], cluster: str) -> str:
    return f"blocked behind higher-priority run {held[cluster][1]} (reserving {cluster})"


def _most_free_of(pool: dict[str, int], held: dict[str, tuple[int, int]]) -> tuple[int, str]:
    """(most free devices on one cluster, reserved or not, that cluster; ties by name)."""
    most, cluster = -1, ""
    for name, free in _all_free(pool, held):
        if free > most or (free == most and name < cluster):
            most, cluster = free, name
    return most, cluster


def _all_free(pool: dict[str, int], held: dict[str, tuple[int, int]]) -> Iterator[tuple[str, int]]:
    yield from pool.items()
    for cluster, (free, _) in held.items():
        yield cluster, free
