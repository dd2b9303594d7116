"""Rule reward scoring: a batch of `exact_match` calls in process against the worker pool.

    python bench/rewards.py [--batch 64] [--repeats 51] [--workers N] [--chars 600] [--seed 0]

Builds `--batch` seeded responses of about `--chars` characters (a `<think>` block of random
words, then `<answer>N</answer>`; half of them right) and times one `score_batch` call of a
`RewardComposer` holding `exact_match` alone, in three ways: `direct` (a plain loop calling the
function, the floor), `in process` (the composer's default for this cheap built-in) and `pooled`
(`in_process: false`: each response goes to a worker process and back, `--workers` workers,
default the composer's). Each is warmed up with three calls (the pool is started and ready before
timing), then timed `--repeats` times, alternating.

Prints the best and median milliseconds per batch of each, with the machine's load average.
Figures only: nothing here passes or fails on time.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable

from rl_core.rewards import RewardComposer, exact_match

WORDS = ["so", "the", "sum", "is", "then", "we", "add", "carry", "check", "digits", "wait"]


def responses(n: int, chars: int, seed: int) -> tuple[list[str], list[str]]:
    """`n` responses of about `chars` characters and their answers; every second one is right."""
    rng = random.Random(seed)
    texts, truths = [], []
    for i in range(n):
        answer = rng.randrange(10_000)
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < chars:
            words.append(rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randrange(1000)))
        given = answer if i % 2 == 0 else answer + 1
        texts.append(f"<think>{' '.join(words)}</think><answer>{given}</answer>")
        truths.append(str(answer))
    return texts, truths


def time_ms(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=51)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--chars", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    texts, truths = responses(args.batch, args.chars, args.seed)
    local = RewardComposer(["exact_match"], num_workers=args.workers)
    pooled = RewardComposer(
        [{"name": "exact_match", "in_process": False}], num_workers=args.workers
    )
    cases: dict[str, Callable[[], object]] = {
        "direct": lambda: [exact_match(t, g) for t, g in zip(texts, truths)],
        "in process": lambda: local.score_batch(texts, truths),
        "pooled": lambda: pooled.score_batch(texts, truths),
    }
    with local, pooled:
        want = local.score_batch(texts, truths)
        assert pooled.score_batch(texts, truths) == want, "pooled and in-process scores differ"
        for _ in range(3):
            for call in cases.values():
                call()
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, call in cases.items():
                times[name].append(time_ms(call))
        workers = pooled.num_workers

    print(
        f"exact_match, {args.batch} responses of ~{args.chars} chars, {workers} pool workers, "
        f"{args.repeats} timed calls each; load average {os.getloadavg()[0]:.2f} "
        f"on {os.cpu_count()} CPUs"
    )
    print(f"{'case':<12} {'best ms':>9} {'median ms':>10} {'vs direct':>10}")
    base = statistics.median(times["direct"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<12} {min(values):>9.3f} {median:>10.3f} {median / base:>9.1f}x")


if __name__ == "__main__":
    main()
