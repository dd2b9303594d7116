"""Placement speed: `experiments.placement.place` on a large seeded queue and many clusters.

    python bench/placement.py [--runs 10000] [--clusters 50] [--repeats 7] [--seed 0] \
        [--scenarios busy,idle,roomy] [--projects 20]

Builds `--clusters` clusters (two in five NPU, two in five GPU, one in five CPU-only; 8 to 256
healthy devices of their kind each, and 64 to 512 CPUs on every cluster) and a queue of `--runs`
runs: priorities from -100 to 100 clustered around 0, queued up to 72 hours before now, asking
for 1 to 64 devices of one kind (NPU 45 %, GPU 45 %, CPU 10 %), 30 % pinned to a cluster that has
that kind, a few asking for more than any cluster holds. Scenarios: `busy` (each cluster has 0
to 25 % of its devices free: about a hundred to two hundred runs start, the rest wait and get
a reason), `idle` (60 to 100 % free: several hundred start; the queue asks for far more than
the clusters hold) and `roomy` (clusters a hundred times larger, 60 to 100 % free: nearly every
run starts, each placement a best-fit scan). Each scenario is timed without `total` (no
reservation) and with it (head-of-line reservation), `--repeats` times after one warm-up call,
and then with `total` and fair share: the runs spread over `--projects` projects (weights 0.5 to
4, a quota on one kind in three projects, each holding some devices already), as the scheduler
calls it.

Prints, per case, how many runs were placed and how many wait, then the best and median wall
time of a call in milliseconds, the best CPU time of a call (the process's own, which other work
on the machine disturbs less) and the queued runs decided per second at the best wall time.
Figures only: nothing here passes or fails on time.
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from experiments.placement import QueuedRun, place  # noqa: E402

HOUR = 3600.0
NOW = 1_750_000_000.0
# name: (cluster size multiplier, fraction of healthy devices free: low, high)
SCENARIOS = {"busy": (1, 0.0, 0.25), "idle": (1, 0.6, 1.0), "roomy": (100, 0.6, 1.0)}


def make_clusters(count: int, rng: random.Random) -> dict[str, dict[str, int]]:
    """cluster -> kind -> healthy devices: every cluster has CPUs, most also NPUs or GPUs."""
    total = {}
    for i in range(count):
        kind = ("npu", "npu", "gpu", "gpu", "cpu")[i % 5]
        name = f"{kind}-{i:02d}"
        total[name] = {"cpu": rng.choice([64, 128, 256, 512])}
        if kind != "cpu":
            total[name][kind] = 8 * rng.choice([1, 2, 4, 8, 16, 32])
    return total


def scale(total: dict[str, dict[str, int]], factor: int) -> dict[str, dict[str, int]]:
    return {name: {kind: n * factor for kind, n in kinds.items()} for name, kinds in total.items()}


def make_free(total: dict[str, dict[str, int]], low: float, high: float, rng: random.Random):
    return {
        name: {kind: int(n * rng.uniform(low, high)) for kind, n in kinds.items()}
        for name, kinds in total.items()
    }


def make_queue(runs: int, total: dict[str, dict[str, int]], rng: random.Random) -> list[QueuedRun]:
    by_kind = {k: [c for c, kinds in total.items() if k in kinds] for k in ("npu", "gpu", "cpu")}
    queue = []
    for i in range(runs):
        kind = rng.choices(["npu", "gpu", "cpu"], weights=[45, 45, 10])[0]
        count = rng.choice([1, 2, 4, 8, 8, 16, 32, 64]) * (8 if rng.random() < 0.01 else 1)
        queue.append(QueuedRun(
            id=i + 1,
            priority=max(-100, min(100, round(rng.gauss(0, 20)))),
            created_at=NOW - rng.uniform(0, 72 * HOUR),
            device_type=kind,
            device_count=count,
            cluster=rng.choice(by_kind[kind]) if rng.random() < 0.3 else None,
        ))
    return queue


def with_projects(queue: list[QueuedRun], projects: int, total, rng: random.Random):
    """The queue spread over projects, and their quotas, usage and weights."""
    names = [f"p{i:02d}" for i in range(projects)]
    spread = [QueuedRun(r.id, r.priority, r.created_at, r.device_type, r.device_count, r.cluster,
                        project=rng.choice(names)) for r in queue]
    healthy = {k: sum(kinds.get(k, 0) for kinds in total.values()) for k in ("npu", "gpu", "cpu")}
    weights = {name: rng.choice([0.5, 1.0, 1.0, 2.0, 4.0]) for name in names}
    usage = {name: {k: int(n * rng.uniform(0, 0.5 / projects)) for k, n in healthy.items()}
             for name in names}
    quotas = {name: {rng.choice(list(healthy)): int(healthy["npu"] * 0.1)}
              for name in names[::3]}
    return spread, {"quotas": quotas, "usage": usage, "weights": weights}


def time_calls(queue, free, total, repeats: int, **shares) -> tuple[list[float], list[float],
                                                                    int, int]:
    """Wall and CPU seconds of each call, and how many runs were placed and wait."""
    placements, waiting = place(queue, free, now=NOW, total=total, **shares)  # warm-up
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        place(queue, free, now=NOW, total=total, **shares)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall, cpu, len(placements), len(waiting)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000, help="queued runs")
    parser.add_argument("--clusters", type=int, default=50, help="clusters")
    parser.add_argument("--repeats", type=int, default=7, help="timed calls per case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--scenarios", default="busy,idle,roomy", help=f"comma list of {', '.join(SCENARIOS)}"
    )
    parser.add_argument("--projects", type=int, default=20,
                        help="projects the fair-share case spreads the runs over")
    args = parser.parse_args(argv)
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        choices = ", ".join(SCENARIOS)
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; choose from {choices}")
    rng = random.Random(args.seed)
    total = make_clusters(args.clusters, rng)
    queue = make_queue(args.runs, total, rng)
    print(
        f"{platform.python_implementation()} {platform.python_version()}; {args.runs:,} runs, "
        f"{args.clusters} clusters, {args.repeats} repeats, seed {args.seed}",
        flush=True,
    )
    for name in scenarios:
        factor, low, high = SCENARIOS[name]
        healthy = scale(total, factor)
        free = make_free(healthy, low, high, random.Random(args.seed + 1))
        spread, shares = with_projects(queue, args.projects, healthy,
                                       random.Random(args.seed + 2))
        for label, runs, cap, extra in (("no total", queue, None, {}),
                                        ("total", queue, healthy, {}),
                                        ("shares", spread, healthy, shares)):
            wall, cpu, placed, waiting = time_calls(runs, free, cap, args.repeats, **extra)
            best, median = min(wall), statistics.median(wall)
            print(
                f"  {name:5s} {label:8s} placed {placed:5,} waiting {waiting:5,}  "
                f"best {best * 1e3:6.1f} ms  median {median * 1e3:6.1f} ms  "
                f"CPU best {min(cpu) * 1e3:6.1f} ms  {args.runs / best:9,.0f} runs/s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
