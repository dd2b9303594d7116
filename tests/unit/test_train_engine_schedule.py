"""The train engine's pure parts: learning-rate factors and micro-batch splits."""

import math

import pytest

from rl_core.engines.balance import token_micro_batches
from rl_core.engines.train import lr_factor, split_rows


def factors(schedule, warmup, total, steps):
    return [lr_factor(s, warmup_steps=warmup, total_steps=total, schedule=schedule) for s in steps]


def test_warmup_is_linear_and_reaches_the_full_lr_at_its_last_step():
    # (step + 1) / 4
    assert factors("constant", 4, 10, range(6)) == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_constant_without_warmup_stays_at_one():
    assert factors("constant", 0, 3, range(5)) == [1.0] * 5


def test_cosine_after_warmup():
    # total 10, warmup 2: p = (step - 2) / 8
    got = factors("cosine", 2, 10, [2, 6, 9, 10, 20])
    expected = [1.0, 0.5, 0.5 * (1 + math.cos(math.pi * 7 / 8)), 0.0, 0.0]
    assert got == pytest.approx(expected)


def test_linear_after_warmup():
    # total 6, warmup 2: 1 - (step - 2) / 4
    assert factors("linear", 2, 6, [0, 1, 2, 3, 5, 6]) == pytest.approx(
        [0.5, 1.0, 1.0, 0.75, 0.25, 0.0]
    )


def test_an_unknown_schedule_names_the_choices():
    with pytest.raises(ValueError, match="constant, cosine, linear"):
        lr_factor(0, warmup_steps=0, total_steps=1, schedule="step")


def test_rows_split_into_consecutive_runs_with_a_short_last_one():
    assert split_rows(7, 3) == [[0, 1, 2], [3, 4, 5], [6]]
    assert split_rows(4, 8) == [[0, 1, 2, 3]]


def test_non_positive_sizes_are_refused():
    with pytest.raises(ValueError):
        split_rows(4, 0)
    with pytest.raises(ValueError):
        token_micro_batches([1], 0)
