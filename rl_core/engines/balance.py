"""Balanced partitions of rows by token count: micro-batches under a budget, shares of ranks.

    parts = karmarkar_karp([5, 9, 2, 7], k=2)              # [[0, 3], [1, 2]]: sums 12 and 11
    micro = token_micro_batches(lengths, max_tokens=4096)  # fewest balanced parts within the budget
    shares = balanced_shares(lengths, ranks=4)             # as many rows per rank, tokens balanced

The Karmarkar–Karp largest differencing method for k parts (as verl's `seqlen_balancing.py`
uses): every item starts as a partial solution of k sums (itself and k-1 empty parts); the two
solutions with the largest spread (largest minus smallest sum) are merged, pairing the largest
part of one with the smallest of the other, until one solution remains. A merge's spread is at
most the larger of its inputs' spreads, so the final spread (largest part minus smallest) is at
most the largest item: `max(parts) - min(parts) <= max(weights)`. With `equal_size` the items
are first dealt, from the largest, into solutions of k single items each (one per part), so
every part gets n / k items and the same bound holds.

Results are deterministic (ties go to the lower index) and every part lists its rows in
increasing order; parts are ordered by their first row.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence


def karmarkar_karp(weights: Sequence[int], k: int, *, equal_size: bool = False) -> list[list[int]]:
    """Partition the indices of `weights` into `k` parts of near-equal weight sums.

    equal_size: every part holds len(weights) / k indices (which must divide). Parts may be
    empty when there are fewer items than parts.
    """
    n = len(weights)
    if k <= 0:
        raise ValueError(f"the number of parts must be positive, got {k}")
    if equal_size and n % k:
        raise ValueError(f"{n} items do not split into {k} parts of equal size")
    order = sorted(range(n), key=lambda i: (-weights[i], i))
    # a partial solution: (-spread, tie-break, [(sum, [indices]) sorted by sum, descending])
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    if equal_size:
        for count, start in enumerate(range(0, n, k)):
            parts = sorted(((weights[i], [i]) for i in order[start:start + k]),
                           key=lambda p: -p[0])
            heap.append((-(parts[0][0] - parts[-1][0]), count, parts))
    else:
        for count, i in enumerate(order):
            parts = [(weights[i], [i])] + [(0, []) for _ in range(k - 1)]
            heap.append((-weights[i], count, parts))
    if not heap:
        return [[] for _ in range(k)]
    heapq.heapify(heap)
    count = len(heap)
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(first, reversed(second))]
        merged.sort(key=lambda p: -p[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), count, merged))
        count += 1
    parts = [sorted(indices) for _, indices in heap[0][2]]
    return sorted(parts, key=lambda p: (not p, p[0] if p else 0))


def token_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """The fewest micro-batches (balanced by Karmarkar–Karp) whose summed `lengths` each stay
    within `max_tokens`: start from ceil(total / budget) parts, add one until every part fits.

    A row longer than the budget cannot fit: a ValueError names both numbers.
    """
    if max_tokens <= 0:
        raise ValueError(f"the token budget must be positive, got {max_tokens}")
    if not lengths:
        return []
    longest = max(lengths)
    if longest > max_tokens:
        raise ValueError(
            f"a sequence of {longest} tokens does not fit the micro-batch token budget of "
            f"{max_tokens}: raise the budget (actor.max_token_len_per_gpu) to at least {longest}")
    parts = max(1, math.ceil(sum(lengths) / max_tokens))
    while True:
        split = [p for p in karmarkar_karp(lengths, parts) if p]
        if all(sum(lengths[i] for i in part) <= max_tokens for part in split):
            return split
        parts += 1


def balanced_shares(lengths: Sequence[int], ranks: int) -> list[list[int]]:
    """Rows for each of `ranks` data-parallel ranks, balanced by tokens: as many rows per rank
    when they divide (a fixed micro-batch size then holds on every rank), otherwise the
    rows' counts may differ by more than one."""
    return karmarkar_karp(lengths, ranks, equal_size=len(lengths) % ranks == 0)
