"""RewardComposer: weighted composition, per-call time limits, errors, in-process and pooled
functions, workers' life cycle."""

import logging
import math
import multiprocessing
import os
import threading
import time

import pytest
from pydantic import ValidationError

from rl_core.rewards import (
    CHEAP_REWARDS,
    REWARDS,
    BatchScores,
    RewardComposer,
    UnknownRewardError,
    exact_match,
    format_strict,
    math_accuracy,
)
from rl_core.spec import RewardConfig, RewardFunctionSpec

WELL_FORMED = "<think>a</think><answer>1</answer>"
POOLED_FORMAT = {"name": "format", "in_process": False}


# Test-only reward functions, registered per test with monkeypatch. Module-level, so the worker
# processes can import them.
def sleepy(completion, ground_truth, *, seconds=60.0):
    if "slow" in completion:
        time.sleep(seconds)
    return 1.0


def raising(completion, ground_truth):
    if "bad" in completion:
        raise ValueError("cannot score this")
    return 1.0


def not_a_number(completion, ground_truth):
    return math.nan


def dying(completion, ground_truth):
    if "die" in completion:
        os._exit(3)
    return 1.0


@pytest.fixture
def test_rewards(monkeypatch):
    for fn in (sleepy, raising, not_a_number, dying):
        monkeypatch.setitem(REWARDS, fn.__name__, fn)


@pytest.fixture(scope="module")
def composer():
    functions = [
        {"name": "math_accuracy", "weight": 1.0},
        {"name": "format", "weight": 0.5},
        {"name": "exact_match", "weight": 0.0, "kwargs": {"ignore_case": True}},
    ]
    with RewardComposer(functions, timeout_s=5.0, num_workers=2) as composer:
        yield composer


def bounded(seconds):
    """Context manager asserting the block took less than `seconds`."""

    class _Timer:
        def __enter__(self):
            self.start = time.monotonic()
            return self

        def __exit__(self, *exc):
            self.elapsed = time.monotonic() - self.start
            assert exc[0] is not None or self.elapsed < seconds, f"took {self.elapsed:.1f} s"

    return _Timer()


# --------------------------------------------------------------------------- composition


def test_it_sums_weighted_scores_and_keeps_each_function(composer):
    completions = [
        "<think>6*7</think><answer>42</answer>",  # right, well formed
        "\\boxed{42}",  # right, no format
        "<think>hm</think><answer>41</answer>",  # wrong, well formed
        "",
    ]
    scores = composer.score_batch(completions, ["42", "42", "42", "42"])
    assert scores.per_function == {
        "math_accuracy": [1.0, 1.0, 0.0, 0.0],
        "format": [1.0, 0.0, 1.0, 0.0],
        "exact_match": [1.0, 0.0, 0.0, 0.0],
    }
    # 1·math + 0.5·format + 0·exact
    assert scores.total == [1.5, 1.0, 0.5, 0.0]
    assert (scores.timeouts, scores.errors) == (0, 0)
    assert scores.metrics() == {
        "reward/math_accuracy/mean": 0.5,
        "reward/format/mean": 0.5,
        "reward/exact_match/mean": 0.25,
        "reward/timeouts": 0.0,
        "reward/errors": 0.0,
    }


def test_it_scores_as_the_functions_do_when_called_directly(composer):
    # training (through the composer) and evaluation (direct calls) cannot drift
    completions = ["\\boxed{\\frac{1}{2}}", "#### 1,000", "<think>1</think>", "-3", WELL_FORMED]
    truths = ["0.5", "1000", "1", "3", "1"]
    scores = composer.score_batch(completions, truths)
    assert scores.per_function["math_accuracy"] == [
        math_accuracy(c, t) for c, t in zip(completions, truths)
    ]
    assert scores.per_function["format"] == [
        format_strict(c, t) for c, t in zip(completions, truths)
    ]
    assert scores.per_function["exact_match"] == [
        exact_match(c, t, ignore_case=True) for c, t in zip(completions, truths)
    ]
    assert composer.score_batch(completions, truths) == scores  # deterministic


def test_it_scores_without_ground_truths(composer):
    scores = composer.score_batch([WELL_FORMED, "x"])
    assert scores.per_function["format"] == [1.0, 0.0]
    assert scores.per_function["math_accuracy"] == [0.0, 0.0]


def test_an_empty_batch_is_empty(composer):
    assert composer.score_batch([], []) == BatchScores(
        total=[], per_function={"math_accuracy": [], "format": [], "exact_match": []}
    )


def test_it_refuses_mismatched_lengths(composer):
    with pytest.raises(ValueError, match="2 completions but 1 ground truths"):
        composer.score_batch(["a", "b"], ["a"])


def test_a_normal_batch_is_fast_after_warm_up(composer):
    completions = [f"<think>{i}+{i}</think><answer>\\boxed{{{2 * i}}}</answer>" for i in range(256)]
    truths = [str(2 * i) for i in range(256)]
    composer.score_batch(completions[:8], truths[:8])
    with bounded(2.0):
        scores = composer.score_batch(completions, truths)
    assert scores.total == [1.5] * 256


def test_it_scores_from_a_thread_that_is_not_the_main_one(composer):
    # math-verify's own time limits use SIGALRM, which fails outside the main thread
    result = {}

    def score():
        result["s"] = composer.score_batch(["\\boxed{2\\sqrt{3}}"], ["\\sqrt{12}"])

    thread = threading.Thread(target=score)
    thread.start()
    thread.join(30)
    assert result["s"].per_function["math_accuracy"] == [1.0]


# --------------------------------------------------------------------------- configuration


def test_it_takes_spec_objects_and_the_reward_config():
    config = RewardConfig(
        functions=[
            RewardFunctionSpec(name="format_lenient", weight=2.0),
            RewardFunctionSpec(name="exact_match", kwargs={"ignore_case": True}),
        ],
        timeout_s=3.0,
    )
    with RewardComposer.from_config(config, num_workers=1) as composer:
        assert composer.names == ["format_lenient", "exact_match"]
        assert composer.timeout_s == 3.0
        scores = composer.score_batch(["<think>a</think><answer>YES</answer>"], ["yes"])
    assert scores.total == [3.0]


def test_bare_names_weigh_one():
    with RewardComposer(["format", "exact_match"], num_workers=1) as composer:
        assert composer.score_batch([WELL_FORMED], ["1"]).total == [2.0]


def test_the_default_reward_config_builds():
    composer = RewardComposer.from_config(RewardConfig())
    assert composer.names == ["math_accuracy"]
    composer.close()  # never started: nothing to stop


@pytest.mark.parametrize(
    "functions, error, match",
    [
        ([{"name": "math_acuracy"}], UnknownRewardError, "choose one of .*math_accuracy"),
        ([{"name": "exact_match", "kwargs": {"case": 1}}], TypeError, "ignore_case"),
        ([{"name": "format"}, {"name": "format", "weight": 2}], ValueError, "listed twice"),
        ([], ValueError, "no reward functions"),
    ],
)
def test_it_refuses_a_bad_function_list_before_starting_workers(functions, error, match):
    with pytest.raises(error, match=match):
        RewardComposer(functions)


def test_it_refuses_a_function_workers_cannot_import(monkeypatch):
    monkeypatch.setitem(REWARDS, "inline", lambda completion, ground_truth: 1.0)
    with pytest.raises(TypeError, match="module-level function"):
        RewardComposer(["inline"])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"num_workers": -1}, "num_workers"),
        ({"start_method": "teleport"}, "teleport"),
    ],
)
def test_it_refuses_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardComposer(["format"], **kwargs)


def test_it_works_with_the_spawn_start_method():
    with RewardComposer([POOLED_FORMAT], num_workers=1, start_method="spawn") as composer:
        assert composer.score_batch([WELL_FORMED, "x"]).total == [1.0, 0.0]
        assert composer._pool is not None


# --------------------------------------------------------------------------- time limits and errors


def test_a_call_over_the_time_limit_scores_zero_and_is_counted(test_rewards, caplog):
    with RewardComposer(["sleepy", "format"], timeout_s=0.5, num_workers=2) as composer:
        completions = ["<think>slow</think><answer>1</answer>", WELL_FORMED, "fast"]
        with caplog.at_level(logging.WARNING), bounded(5.0):
            scores = composer.score_batch(completions)
        assert scores.per_function["sleepy"] == [0.0, 1.0, 1.0]
        # the functions after the one that timed out still score the sample
        assert scores.per_function["format"] == [1.0, 1.0, 0.0]
        assert (scores.timeouts, scores.errors) == (1, 0)
        assert (composer.timeouts, composer.errors) == (1, 0)
        assert scores.metrics()["reward/timeouts"] == 1.0
        assert "'sleepy' timed out after 0.5 s on sample 0" in caplog.text

        # the stuck worker was replaced: scoring goes on
        with bounded(2.0):
            again = composer.score_batch(["fast", WELL_FORMED])
        assert again.per_function["sleepy"] == [1.0, 1.0]
        assert composer.timeouts == 1


def test_many_stuck_calls_with_one_worker_each_cost_one_time_limit(test_rewards):
    with RewardComposer(["sleepy"], timeout_s=0.3, num_workers=1) as composer:
        with bounded(6.0):
            scores = composer.score_batch(["slow 1", "fast", "slow 2", "slow 3", "fast"])
        assert scores.total == [0.0, 1.0, 0.0, 0.0, 1.0]
        assert scores.timeouts == 3


def test_a_pathological_expression_times_out_instead_of_hanging():
    # sympy would try to evaluate the power tower for ever
    with RewardComposer(["math_accuracy"], timeout_s=1.0, num_workers=2) as composer:
        with bounded(10.0):
            scores = composer.score_batch(
                ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{42}", "x" * 1_000_000], ["3", "42", "42"]
            )
        assert scores.total == [0.0, 1.0, 0.0]
        assert composer.timeouts == 1
        assert composer.score_batch(["\\boxed{\\frac{1}{2}}"], ["0.5"]).total == [1.0]


def test_a_raising_function_scores_zero_and_is_counted(test_rewards, caplog):
    with RewardComposer(["raising", "not_a_number", "format"], num_workers=1) as composer:
        with caplog.at_level(logging.WARNING):
            scores = composer.score_batch(["bad", WELL_FORMED])
        assert scores.per_function == {
            "raising": [0.0, 1.0],
            "not_a_number": [0.0, 0.0],
            "format": [0.0, 1.0],
        }
        assert (scores.timeouts, scores.errors) == (0, 3)
        assert composer.errors == 3
        assert "ValueError: cannot score this" in caplog.text


def test_a_worker_that_dies_is_replaced(test_rewards):
    with RewardComposer(["dying", "format"], num_workers=1) as composer:
        scores = composer.score_batch(["<think>die</think><answer>1</answer>", WELL_FORMED])
        assert scores.per_function == {"dying": [0.0, 1.0], "format": [1.0, 1.0]}
        assert scores.errors == 1
        assert composer.score_batch([WELL_FORMED]).total == [2.0]


# --------------------------------------------------------------------------- life cycle


def test_close_stops_the_workers_and_a_later_batch_restarts_them():
    composer = RewardComposer([POOLED_FORMAT], num_workers=2)
    composer.score_batch([WELL_FORMED])
    processes = [w.process for w in composer._pool.workers]
    assert all(p.is_alive() for p in processes)
    with bounded(5.0):
        composer.close()
    assert not any(p.is_alive() for p in processes)
    composer.close()  # twice is harmless
    assert composer.score_batch([WELL_FORMED]).total == [1.0]
    composer.close()


def test_close_kills_a_worker_that_is_stuck(test_rewards):
    composer = RewardComposer(["sleepy"], timeout_s=30.0, num_workers=1)
    composer.score_batch(["fast"])
    worker = composer._pool.workers[0]
    worker.assign(0, 0, "slow", None)  # leave it stuck in a call, as if a batch was interrupted
    with bounded(5.0):
        composer.close()
    assert not worker.process.is_alive()


def test_an_interrupted_batch_leaves_no_stale_results(test_rewards, monkeypatch):
    from rl_core.rewards import composer as composer_module

    with RewardComposer(["sleepy"], timeout_s=30.0, num_workers=1) as composer:
        composer.score_batch(["fast"])
        receive = composer_module._Pool._receive

        def interrupted(self, batch, wait_s):
            receive(self, batch, 0.05)
            raise KeyboardInterrupt

        monkeypatch.setattr(composer_module._Pool, "_receive", interrupted)
        with pytest.raises(KeyboardInterrupt), bounded(5.0):
            composer.score_batch(["slow", "fast"])
        monkeypatch.setattr(composer_module._Pool, "_receive", receive)
        assert composer.score_batch(["fast", "fast"]).total == [1.0, 1.0]


# --------------------------------------------------------------------------- in process or pooled

CHEAP = [
    {"name": "format", "weight": 0.5},
    {"name": "format_lenient"},
    {"name": "exact_match", "kwargs": {"ignore_case": True}},
    {"name": "countdown"},
]
MIXED_COMPLETIONS = [
    "<think>6*7</think><answer>42</answer>",
    "<think>x</think> so <answer>\\boxed{42}</answer>",
    "<think>(3+1)*6</think><answer>(3+1)*6</answer>",
    "<think>never closed",
    "",
]
MIXED_TRUTHS = ["42", "42", '{"target": 24, "numbers": [3, 1, 6]}', "42", None]


def all_pooled(functions):
    return [{**f, "in_process": False} for f in functions]


def test_cheap_builtins_are_the_ones_with_nothing_to_stop():
    assert CHEAP_REWARDS == {
        "format", "format_strict", "format_lenient", "exact_match", "countdown"
    }
    assert CHEAP_REWARDS < set(REWARDS)
    assert not {"math_accuracy", "math"} & CHEAP_REWARDS


def test_cheap_functions_score_in_process_without_starting_a_pool():
    before = set(multiprocessing.active_children())
    with RewardComposer(CHEAP, num_workers=2) as composer:
        assert [t.in_process for t in composer.terms] == [True] * 4
        scores = composer.score_batch(MIXED_COMPLETIONS, MIXED_TRUTHS)
        assert composer._pool is None
        assert set(multiprocessing.active_children()) == before
    assert scores.per_function == {
        "format": [1.0, 0.0, 1.0, 0.0, 0.0],
        "format_lenient": [1.0, 1.0, 1.0, 0.0, 0.0],
        "exact_match": [1.0, 0.0, 0.0, 0.0, 0.0],
        "countdown": [0.0, 0.0, 1.0, 0.0, 0.0],
    }
    # 0.5·format + format_lenient + exact_match + countdown
    assert scores.total == [2.5, 1.0, 2.5, 0.0, 0.0]


def test_a_pool_starts_only_for_the_pooled_functions():
    with RewardComposer(["math_accuracy", "format"], num_workers=1) as composer:
        assert [t.in_process for t in composer.terms] == [False, True]
        assert composer.score_batch(["<think>a</think><answer>42</answer>"], ["42"]).total == [2.0]
        assert [t.name for t in composer._pool.terms] == ["math_accuracy"]


@pytest.mark.parametrize("pooled", [["math_accuracy"], ["math_accuracy", "exact_match"]])
def test_mixed_functions_score_as_all_pooled(pooled):
    functions = [{"name": "math_accuracy", "weight": 2.0}, *CHEAP]
    mixed = [{**f, "in_process": None if f["name"] not in pooled else False} for f in functions]
    with RewardComposer(mixed, num_workers=2) as composer:
        got = composer.score_batch(MIXED_COMPLETIONS, MIXED_TRUTHS)
        assert [t.name for t in composer._pool.terms] == pooled
    with RewardComposer(all_pooled(functions), num_workers=2) as composer:
        want = composer.score_batch(MIXED_COMPLETIONS, MIXED_TRUTHS)
    assert got == want
    assert got.total[0] == 2.0 + 0.5 + 1.0 + 1.0  # math, format, format_lenient, exact_match


@pytest.mark.parametrize("in_process", [True, False])
def test_errors_are_the_same_in_process_as_in_a_worker(test_rewards, caplog, in_process):
    functions = [
        {"name": "raising", "in_process": in_process},
        {"name": "not_a_number", "in_process": in_process},
        {"name": "format"},
    ]
    with RewardComposer(functions, num_workers=1) as composer:
        with caplog.at_level(logging.WARNING):
            scores = composer.score_batch(["bad", WELL_FORMED])
        assert (composer._pool is None) == in_process
        assert scores.per_function == {
            "raising": [0.0, 1.0],
            "not_a_number": [0.0, 0.0],
            "format": [0.0, 1.0],
        }
        assert (scores.timeouts, scores.errors) == (0, 3)
        assert (composer.timeouts, composer.errors) == (0, 3)
        assert "reward 'raising' raised on sample 0: ValueError: cannot score this" in caplog.text
        assert "reward 'not_a_number' raised on sample 1: non-finite score nan" in caplog.text


@pytest.mark.parametrize("in_process", [True, False])
def test_a_call_past_the_limit_is_a_timeout_in_process_as_in_a_worker(
    test_rewards, caplog, in_process
):
    # in process the slow call returns 1.0 after 0.6 s; it still scores 0 as a timeout
    functions = [{"name": "sleepy", "kwargs": {"seconds": 0.6}, "in_process": in_process}, "format"]
    with RewardComposer(functions, timeout_s=0.2, num_workers=1) as composer:
        completions = ["<think>slow</think><answer>1</answer>", WELL_FORMED]
        with caplog.at_level(logging.WARNING), bounded(5.0):
            scores = composer.score_batch(completions)
        assert scores.per_function == {"sleepy": [0.0, 1.0], "format": [1.0, 1.0]}
        assert scores.total == [1.0, 2.0]
        assert (scores.timeouts, scores.errors) == (1, 0)
        assert (composer.timeouts, composer.errors) == (1, 0)
        assert "'sleepy' timed out after 0.2 s on sample 0 (37 chars); scored 0" in caplog.text
        assert composer.score_batch(["fast"]).per_function["sleepy"] == [1.0]
        assert composer.timeouts == 1


def test_failures_in_process_and_in_the_pool_share_one_warning_budget(test_rewards, caplog):
    functions = [{"name": "raising", "in_process": True}, {"name": "not_a_number"}]
    with RewardComposer(functions, num_workers=1) as composer:
        with caplog.at_level(logging.WARNING):
            scores = composer.score_batch(["bad", "bad", "bad"])
    assert scores.errors == 6
    assert caplog.text.count(" raised on sample ") == 3
    assert "3 more reward calls failed in this batch" in caplog.text


def test_in_process_true_runs_any_function_here(monkeypatch):
    # a function a worker could not import is fine in process
    monkeypatch.setitem(REWARDS, "inline", lambda completion, ground_truth: 1.0)
    functions = [
        {"name": "inline", "in_process": True},
        {"name": "math_accuracy", "in_process": True},
    ]
    with RewardComposer(functions) as composer:
        assert composer.score_batch(["\\boxed{2\\sqrt{3}}"], ["\\sqrt{12}"]).total == [2.0]
        assert composer._pool is None


def test_the_spec_field_chooses_where_a_function_runs():
    assert RewardFunctionSpec(name="format").in_process is None
    config = RewardConfig(
        functions=[
            RewardFunctionSpec(name="format", in_process=False),
            RewardFunctionSpec(name="exact_match"),
            RewardFunctionSpec(name="math_accuracy", in_process=True),
        ]
    )
    with RewardComposer.from_config(config, num_workers=1) as composer:
        assert [t.in_process for t in composer.terms] == [False, True, True]
        assert composer.score_batch([WELL_FORMED], ["1"]).total == [3.0]
        assert [t.name for t in composer._pool.terms] == ["format"]


def test_the_spec_field_refuses_what_is_not_a_bool():
    with pytest.raises(ValidationError, match="in_process"):
        RewardFunctionSpec(name="format", in_process="sometimes")
    with pytest.raises(TypeError, match="'format': in_process must be true, false or null"):
        RewardComposer([{"name": "format", "in_process": "sometimes"}])
