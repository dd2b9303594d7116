"""Karmarkar–Karp partitions: every row once, the token budget kept, the spread within the
largest item (the bound the method guarantees), equal sizes when asked."""

from __future__ import annotations

import random

import pytest

from rl_core.engines.balance import balanced_shares, karmarkar_karp, token_micro_batches


def long_tail(n: int, seed: int) -> list[int]:
    """Lengths with a long tail: most short, a few near the top."""
    rng = random.Random(seed)
    return [int(min(512, 8 + rng.paretovariate(1.2) * 20)) for _ in range(n)]


def sums(parts, weights):
    return [sum(weights[i] for i in part) for part in parts]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k", [2, 3, 8])
def test_every_row_once_and_the_spread_within_the_largest_item(seed, k):
    weights = long_tail(48, seed)
    for equal_size in (False, True):
        parts = karmarkar_karp(weights, k, equal_size=equal_size)
        assert len(parts) == k
        assert sorted(i for part in parts for i in part) == list(range(len(weights)))
        totals = sums(parts, weights)
        assert max(totals) - min(totals) <= max(weights)
        assert all(part == sorted(part) for part in parts)
        if equal_size:
            assert {len(part) for part in parts} == {len(weights) // k}


def test_the_partition_beats_consecutive_runs_on_a_long_tail():
    weights = sorted(long_tail(64, 0))  # sorted: consecutive runs are as unbalanced as can be
    kk = sums(karmarkar_karp(weights, 4, equal_size=True), weights)
    runs = sums([range(i, i + 16) for i in range(0, 64, 16)], weights)
    assert max(kk) - min(kk) < (max(runs) - min(runs)) / 4


def test_a_known_small_case_and_determinism():
    assert karmarkar_karp([5, 9, 2, 7], 2) == [[0, 3], [1, 2]]
    weights = long_tail(30, 3)
    assert karmarkar_karp(weights, 4) == karmarkar_karp(list(weights), 4)


def test_fewer_items_than_parts_leaves_parts_empty():
    parts = karmarkar_karp([3, 1], 4)
    assert sorted(map(tuple, parts)) == [(), (), (0,), (1,)]
    assert karmarkar_karp([], 2) == [[], []]


@pytest.mark.parametrize("budget", [512, 700, 1500])
def test_micro_batches_respect_the_budget_and_are_few(budget):
    lengths = long_tail(64, 1)
    micro = token_micro_batches(lengths, budget)
    assert sorted(i for part in micro for i in part) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in part) <= budget for part in micro)
    assert len(micro) >= -(-sum(lengths) // budget)
    # greedy consecutive filling needs at least as many micro-batches
    greedy, used = 1, 0
    for length in lengths:
        if used + length > budget:
            greedy, used = greedy + 1, 0
        used += length
    assert len(micro) <= greedy


def test_a_budget_below_one_sequence_names_both_numbers():
    with pytest.raises(ValueError, match=r"600 tokens.*budget of 512.*max_token_len_per_gpu"):
        token_micro_batches([10, 600, 20], 512)
    with pytest.raises(ValueError, match="positive"):
        token_micro_batches([1], 0)


def test_rank_shares_hold_as_many_rows_when_they_divide():
    lengths = long_tail(16, 2)
    shares = balanced_shares(lengths, 4)
    assert [len(s) for s in shares] == [4, 4, 4, 4]
    uneven = balanced_shares(lengths[:15], 4)
    assert sorted(i for s in uneven for i in s) == list(range(15))
