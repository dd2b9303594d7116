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
depend on the order of the input. Both returned lists follow the order of the walk (this order,
interleaved between projects by fair share, below).

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
- "needs 16 npu devices; project vision's quota is 8" / "project vision's quota of 8 npu devices:
  6 held, this run needs 4" (cause "quota")
- "fair share: npu devices went first to projects further below their share (speech); project
  vision holds 8 npu devices at weight 1" (cause "share")
- "cluster npu-b has no capacity listed" (pinned to a cluster absent from `free` and `total`)
- "cluster npu-b has no npu devices" / "no cluster has npu devices"
- "needs 16 npu devices; cluster npu-b has 8 healthy in all" (pinned, never fits)
- "needs 16 npu devices; largest cluster: 8 healthy (npu-a)" (unpinned, never fits)
- "blocked behind higher-priority run 17 (reserving npu-a)" (it would fit there but for the
  reservation of run 17, ahead of it in the order); "blocked behind run 17 of project speech,
  placed first by fair share (reserving npu-a)" when the fair-share walk put that run first
- "needs 4 npu devices; cluster npu-b has 2 free" (pinned)
- "needs 8 npu devices; largest free on any cluster: 4 (npu-a)" (unpinned; over every cluster
  with devices of that kind)
- with `allowed`: "no cluster whose path policy allows this run has npu devices", and the
  largest-cluster and largest-free reasons say "... a cluster its path policy allows"

Quotas and fair share (only when runs carry a `project`). A project's `quotas` cap the devices
of each kind its active runs may hold: a run that would take its project past its quota waits
(cause "quota") and reserves nothing, whatever is free; a quota lowered below what the project
holds stops new admissions only. Among waiting runs, the walk favours the project furthest below
its share, by dominant-resource fairness over devices: a project's dominant share is the largest,
over device kinds, of the fraction of all healthy devices of that kind (`total`, summed over
clusters) its runs hold (`usage`, then what this pass placed), divided by its `weights` entry
(1.0 when absent). At each step the project of least dominant share (ties: the project whose next
run comes first in the order above) offers its next run in that order; each placement raises its
project's share. So with one project, or projects holding nothing, the walk is the order above,
and priority and aging order each project's own runs. A run that waits for devices it would have
found free at the start of the pass, had runs of other projects not been placed first, is told so
(cause "share"); the others wait for capacity (cause "capacity"), or for the placement limit
(cause "limit").

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

import heapq
from collections import deque
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
    project: str | None = None  # whose quota and share it counts against; None: no project


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
    cause: str = "capacity"  # "capacity" | "quota" | "share" | "limit"


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
    quotas: Capacities | None = None,
    usage: Capacities | None = None,
    weights: Mapping[str, float] | None = None,
) -> tuple[list[Placement], list[Waiting]]:
    """Decide where queued runs start and why the others wait (rules in the module docstring).

    free: cluster -> kind -> free devices now; total: cluster -> kind -> healthy devices, or
    None to reserve nothing. quotas: project -> kind -> most devices its runs may hold (a kind
    absent: no limit); usage: project -> kind -> devices its active runs hold now; weights:
    project -> fair-share weight (> 0, 1.0 when absent). Returns (placements, waiting) in the
    order decided; every run of the queue is in exactly one of them.
    O(n log n + n * clusters).
    """
    if aging_per_hour < 0:
        raise ValueError(f"aging_per_hour must be >= 0, got {aging_per_hour}")
    if max_placements is not None and max_placements < 0:
        raise ValueError(f"max_placements must be >= 0, got {max_placements}")
    if len({run.id for run in queue}) != len(queue):
        raise ValueError("queued run ids must be unique")
    if any(w <= 0 for w in (weights or {}).values()):
        raise ValueError(f"fair-share weights must be > 0, got {dict(weights or {})}")
    state = _Pass(free, total)
    shares = _FairShare(queue_order(queue, now, aging_per_hour), free, total, quotas, usage,
                        weights)
    limit = len(queue) if max_placements is None else max_placements
    placements: list[Placement] = []
    waiting: list[Waiting] = []
    for run in shares:
        if len(placements) >= limit:
            waiting.append(Waiting(run.id, f"placement limit of {limit} reached in this pass",
                                   "limit"))
            continue
        over = shares.over_quota(run)
        if over is not None:
            waiting.append(Waiting(run.id, over, "quota"))
            continue
        cluster = state.fit(run)
        if cluster is None:
            reason = state.wait(run, shares.project_of)
            overtaken = shares.overtaken(run)
            waiting.append(Waiting(run.id, overtaken, "share") if overtaken
                           else Waiting(run.id, reason))
        else:
            shares.take(run, cluster)
            placements.append(Placement(run.id, cluster))
    return placements, waiting


class _FairShare:
    """The walk over the queue in fair-share order, and the quotas (module docstring).

    Iterating yields every run once; `take` records a placement, which the next steps of the
    walk see. Runs of one project keep their order; between projects the least dominant share
    goes first (a heap of projects keyed by (share, rank of their next run in the queue order)).
    """

    def __init__(self, ordered: list[QueuedRun], free: Capacities, total: Capacities | None,
                 quotas: Capacities | None, usage: Capacities | None,
                 weights: Mapping[str, float] | None):
        self.quotas = quotas or {}
        self.weights = weights or {}
        self.usage = {project: dict(kinds) for project, kinds in (usage or {}).items()}
        self.capacity: dict[str, int] = {}
        for kinds in (total if total is not None else free).values():
            for kind, n in kinds.items():
                self.capacity[kind] = self.capacity.get(kind, 0) + n
        if total is None:  # free devices plus what the projects hold is the best estimate
            for kinds in self.usage.values():
                for kind, n in kinds.items():
                    self.capacity[kind] = self.capacity.get(kind, 0) + n
        self.pending: dict[str | None, deque[tuple[int, QueuedRun]]] = {}
        for rank, run in enumerate(ordered):
            self.pending.setdefault(run.project, deque()).append((rank, run))
        self.project_of = {run.id: run.project for run in ordered}
        self.several = len(self.pending) > 1
        # Free devices of each kind per cluster at the start of the pass, and the projects that
        # took devices of each kind in this pass (for the "share" reason).
        self.initial = {kind: {} for kinds in free.values() for kind in kinds}
        for cluster, kinds in free.items():
            for kind, n in kinds.items():
                self.initial[kind][cluster] = n
        self.takers: dict[tuple[str, str], set[str | None]] = {}

    def share(self, project: str | None) -> float:
        """Dominant share: max over kinds of held / all healthy, divided by the weight."""
        held = self.usage.get(project, {})
        fractions = (n / self.capacity[k] for k, n in held.items() if self.capacity.get(k))
        return max(fractions, default=0.0) / self.weights.get(project, 1.0)

    def __iter__(self) -> Iterator[QueuedRun]:
        heap = [(self.share(p), runs[0][0], p) for p, runs in self.pending.items()]
        heapq.heapify(heap)
        while heap:
            _, _, project = heapq.heappop(heap)
            runs = self.pending[project]
            yield runs.popleft()[1]
            if runs:
                heapq.heappush(heap, (self.share(project), runs[0][0], project))

    def take(self, run: QueuedRun, cluster: str) -> None:
        held = self.usage.setdefault(run.project, {})
        held[run.device_type] = held.get(run.device_type, 0) + run.device_count
        self.takers.setdefault((run.device_type, cluster), set()).add(run.project)

    def over_quota(self, run: QueuedRun) -> str | None:
        """Why the run would take its project past its quota, or None."""
        quota = self.quotas.get(run.project, {}).get(run.device_type)
        if quota is None:
            return None
        kind, need = run.device_type, run.device_count
        if need > quota:
            return f"needs {need} {kind} devices; project {run.project}'s quota is {quota}"
        held = self.usage.get(run.project, {}).get(kind, 0)
        if held + need > quota:
            return (f"project {run.project}'s quota of {quota} {kind} devices: {held} held, "
                    f"this run needs {need}")
        return None

    def overtaken(self, run: QueuedRun) -> str | None:
        """The "share" reason when, on a cluster the run may use whose free devices at the start
        of the pass would have held it, runs of other projects took devices of its kind."""
        if not self.several:
            return None
        kind, start = run.device_type, self.initial.get(run.device_type, {})
        others: set[str | None] = set()
        for cluster, n in start.items():
            if (n >= run.device_count and (run.cluster is None or cluster == run.cluster)
                    and (run.allowed is None or cluster in run.allowed)):
                others |= self.takers.get((kind, cluster), set())
        others.discard(run.project)
        if not others:
            return None
        names = ", ".join(sorted(str(p) for p in others))
        held = self.usage.get(run.project, {}).get(run.device_type, 0)
        weight = self.weights.get(run.project, 1.0)
        return (f"fair share: {run.device_type} devices went first to projects further below "
                f"their share ({names}); project {run.project} holds {held} "
                f"{run.device_type} devices at weight {weight:g}")


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
        self.project_of: Mapping[int, str | None] = {}
        self.asking: str | None = None
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

    def wait(self, run: QueuedRun, project_of: Mapping[int, str | None] | None = None) -> str:
        """Why a run that did not fit waits; reserves its best candidate when it may.
        project_of: run id -> project, to say when a blocker of another project went first."""
        self.project_of, self.asking = project_of or {}, run.project
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
            return self._blocked(held, blocker)
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
            return self._blocked(held, blocker)
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
                return self._blocked(held, cluster)
        else:
            free = pool[cluster]
            if self.reserving:
                self._reserve(run.device_type, cluster, run.id)
        return f"needs {need} {kind} devices; cluster {cluster} has {free} free"

    def _blocked(self, held: dict[str, tuple[int, int]], cluster: str) -> str:
        blocker = held[cluster][1]
        project = self.project_of.get(blocker)
        if project != self.asking:
            return (f"blocked behind run {blocker} of project {project}, placed first by fair "
                    f"share (reserving {cluster})")
        return f"blocked behind higher-priority run {blocker} (reserving {cluster})"

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


# --------------------------------------------------------------------------- preemption


@dataclass(frozen=True)
class ActiveRun:
    """A run whose attempt holds devices (SCHEDULED, STARTING, RUNNING, PREEMPTING, ...)."""

    id: int
    priority: int
    project: str | None
    device_type: str
    device_count: int
    cluster: str
    started_at: float  # when its current attempt was placed (seconds since the epoch)
    preemptible: bool = True
    stoppable: bool = True  # its job runs (STARTING or RUNNING): a stop can reach it
    preempting: bool = False  # already being stopped for another run: its devices come free


@dataclass(frozen=True)
class Preemption:
    """Stop run `victim` (it checkpoints and goes back to the queue) to make room for `for_run`
    on `cluster`."""

    victim: int
    for_run: int
    cluster: str
    reason: str


def above_share(usage: Capacities, capacity: Mapping[str, int], weights: Mapping[str, float],
                projects: set[str | None]) -> dict[str | None, bool]:
    """Which of `projects` (those with runs active or waiting) hold more than their share: a
    project's dominant fraction of the healthy devices (max over kinds of held / healthy) above
    its weight's part of the weights of all of them."""
    total_weight = sum(weights.get(p, 1.0) for p in projects) or 1.0
    result = {}
    for project in projects:
        held = usage.get(project, {})
        fraction = max((n / capacity[k] for k, n in held.items() if capacity.get(k)), default=0.0)
        result[project] = fraction > weights.get(project, 1.0) / total_weight + 1e-12
    return result


def preempt(waiting: Sequence[QueuedRun], active: Sequence[ActiveRun], free: Capacities, *,
            total: Capacities, weights: Mapping[str, float] | None = None,
            max_preemptions: int | None = None) -> list[Preemption]:
    """Which active runs to stop so that waiting runs of higher priority can start.

    waiting: the runs a placement pass left waiting for devices (cause capacity or share, never
    quota), in the pass's order; active: every run holding devices; free: free devices per
    cluster and kind after the pass; total: healthy devices per cluster and kind.

    Rules. A run may only be stopped when it is preemptible, its job runs, its priority is
    lower than the waiting run's, and its project holds more than its share (`above_share`,
    counted again after each choice: once a project no longer holds more than its share, none
    of its runs is stopped; a project within its share is never touched). For each waiting run in turn,
    on each cluster it may use whose healthy total could hold it, the victims are taken lowest
    priority first, then the most recently placed (the least work lost), until the free devices
    plus the devices of runs already being stopped there plus the victims' reach what it needs;
    the cluster needing the fewest devices stopped wins (ties by name). Devices of runs already
    being stopped count as coming free, so a run that waits for them preempts nothing more. A
    waiting run that no set of allowed victims makes fit preempts nothing. Pure: reads nothing.
    """
    weights = weights or {}
    capacity: dict[str, int] = {}
    for kinds in total.values():
        for kind, n in kinds.items():
            capacity[kind] = capacity.get(kind, 0) + n
    usage: dict[str | None, dict[str, int]] = {}
    for run in active:
        held = usage.setdefault(run.project, {})
        held[run.device_type] = held.get(run.device_type, 0) + run.device_count
    projects = {run.project for run in active} | {run.project for run in waiting}
    room = {c: dict(kinds) for c, kinds in free.items()}  # free now plus what is being freed
    for run in active:
        if run.preempting:
            kinds = room.setdefault(run.cluster, {})
            kinds[run.device_type] = kinds.get(run.device_type, 0) + run.device_count
    candidates = sorted((r for r in active if r.preemptible and r.stoppable and not r.preempting),
                        key=lambda r: (r.priority, -r.started_at, -r.id))
    chosen: list[Preemption] = []
    taken: set[int] = set()
    limit = len(active) if max_preemptions is None else max_preemptions
    for run in waiting:
        if len(chosen) >= limit:
            break
        kind, need = run.device_type, run.device_count
        clusters = [c for c, kinds in total.items() if kinds.get(kind, 0) >= need
                    and (run.cluster is None or c == run.cluster)
                    and (run.allowed is None or c in run.allowed)]
        if any(room.get(c, {}).get(kind, 0) >= need for c in clusters):
            continue  # devices being freed will hold it: wait for them
        best: tuple[int, str, list[ActiveRun]] | None = None
        over = above_share(usage, capacity, weights, projects)
        for cluster in sorted(clusters):
            victims = _victims(run, cluster, candidates, taken, room, usage, capacity, weights,
                               projects, dict(over))
            if victims is not None:
                stopped = sum(v.device_count for v in victims)
                if best is None or (stopped, cluster) < best[:2]:
                    best = (stopped, cluster, victims)
        if best is None:
            continue
        _, cluster, victims = best
        for victim in victims[:max(0, limit - len(chosen))]:
            taken.add(victim.id)
            held = usage[victim.project]
            held[kind] -= victim.device_count
            chosen.append(Preemption(victim.id, run.id, cluster, (
                f"preempted for run {run.id} (priority {run.priority}, project {run.project}): "
                f"project {victim.project} holds more than its share and this run's priority "
                f"{victim.priority} is lower; it stops after saving its step and resumes from "
                f"that checkpoint when placed again")))
        room.setdefault(cluster, {})[kind] = room.get(cluster, {}).get(kind, 0) - need + sum(
            v.device_count for v in victims)
    return chosen


def _victims(run: QueuedRun, cluster: str, candidates: list[ActiveRun], taken: set[int],
             room: Capacities, usage: dict, capacity: Mapping[str, int],
             weights: Mapping[str, float], projects: set[str | None],
             over: dict[str | None, bool]) -> list[ActiveRun] | None:
    """The runs to stop on `cluster` for `run` (rules in `preempt`), or None if none suffice."""
    kind, need = run.device_type, run.device_count
    have = room.get(cluster, {}).get(kind, 0)
    held = {p: dict(kinds) for p, kinds in usage.items()}
    victims = []
    for victim in candidates:
        if have >= need:
            break
        if (victim.id in taken or victim.cluster != cluster or victim.device_type != kind
                or victim.priority >= run.priority or not over.get(victim.project)):
            continue
        victims.append(victim)
        have += victim.device_count
        held[victim.project][kind] -= victim.device_count
        over = above_share(held, capacity, weights, projects)
    return victims if have >= need else None
