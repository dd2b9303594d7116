"""Format, exact-match and countdown rewards; the registry and its one signature."""

import inspect
import json

import pytest

from rl_core.rewards import (
    REWARDS,
    UnknownRewardError,
    countdown,
    exact_match,
    format_lenient,
    format_strict,
    get_reward,
    reward_names,
)
from rl_core.rewards.registry import check_kwargs

# --------------------------------------------------------------------------- format


@pytest.mark.parametrize(
    "completion, strict, lenient",
    [
        ("<think>a</think><answer>b</answer>", 1.0, 1.0),
        ("  <think>\nsteps\n</think>\n\n<answer> 42 </answer>\n", 1.0, 1.0),
        ("<think></think><answer>42</answer>", 1.0, 1.0),  # empty reasoning is still the format
        ("<think>a</think><answer> </answer>", 0.0, 0.0),  # empty answer
        ("<think>a</think> so <answer>b</answer>", 0.0, 1.0),  # text between the blocks
        ("Sure! <think>a</think><answer>b</answer>", 0.0, 1.0),  # text before
        ("<think>a</think><answer>b</answer> Hope this helps", 0.0, 1.0),  # text after
        ("<answer>b</answer><think>a</think>", 0.0, 0.0),  # wrong order
        ("<think>a</think>", 0.0, 0.0),  # no answer
        ("<answer>b</answer>", 0.0, 0.0),  # no reasoning
        ("<think>a<answer>b</answer>", 0.0, 0.0),  # reasoning never closed
        ("<think>a</think><answer>b", 0.0, 0.0),  # answer never closed
        ("<think>a</think><answer>b</answer><answer>c</answer>", 0.0, 1.0),  # two answers
        ("<think>a<think>b</think><answer>c</answer>", 0.0, 1.0),  # nested think
        ("<think>a</think><answer>b</answer></think>", 0.0, 1.0),  # stray tag
        ("", 0.0, 0.0),
        ("42", 0.0, 0.0),
    ],
)
def test_format_rewards(completion, strict, lenient):
    assert format_strict(completion, None) == strict
    assert format_lenient(completion, None) == lenient


@pytest.mark.parametrize(
    "completion, score",
    [
        ("steps</think><answer>42</answer>", 1.0),
        ("<think>steps</think><answer>42</answer>", 0.0),  # the prompt already opened it
    ],
)
def test_format_with_think_in_the_prompt(completion, score):
    assert format_strict(completion, None, think_in_prompt=True) == score


def test_lenient_format_with_think_in_the_prompt():
    assert format_lenient("steps</think> ok <answer>42</answer>", None, think_in_prompt=True) == 1.0
    assert format_lenient("steps <answer>42</answer>", None, think_in_prompt=True) == 0.0


# --------------------------------------------------------------------------- exact match


@pytest.mark.parametrize(
    "completion, truth, kwargs, score",
    [
        ("357", "357", {}, 1.0),
        ("  357\n", "357", {}, 1.0),
        ("hello   world", "hello world", {}, 1.0),
        ("hello\n\tworld ", " hello world", {}, 1.0),
        ("Hello World", "hello world", {}, 0.0),
        ("Hello World", "hello world", {"ignore_case": True}, 1.0),
        ("3570", "357", {}, 0.0),
        ("", "357", {}, 0.0),
        ("", "", {}, 1.0),
        ("357", None, {}, 0.0),
        ("357", 357, {}, 1.0),
        ("<think>x</think><answer> 357 </answer>", "357", {}, 1.0),
        ("<think>x</think><answer>357</answer>", "357", {"from_answer_tag": False}, 0.0),
        ("<think>x</think> 357", "357", {}, 1.0),
        ("<think>357", "357", {}, 0.0),  # cut off while reasoning
        ("<think>357", "<think>357", {"ignore_think": False}, 1.0),
    ],
)
def test_exact_match(completion, truth, kwargs, score):
    assert exact_match(completion, truth, **kwargs) == score


# --------------------------------------------------------------------------- countdown


PROBLEM = {"target": 24, "numbers": [3, 7, 8, 2]}


@pytest.mark.parametrize(
    "completion, truth, score",
    [
        ("<think>try</think><answer>(7 - 3) * (8 - 2)</answer>", PROBLEM, 1.0),
        ("(7-3)*(8-2) = 24", json.dumps(PROBLEM), 1.0),
        ("let me see\n(7-3)*(8-2)\n", PROBLEM, 1.0),
        ("<answer>3 * 8</answer>", PROBLEM, 0.0),  # not every number used
        ("<answer>(7 - 3) * (8 - 2) + 1</answer>", PROBLEM, 0.0),  # 1 is not given
        ("<answer>7 + 3 + 8 + 2</answer>", PROBLEM, 0.0),  # 20
        ("<answer>__import__('os')</answer>", PROBLEM, 0.0),
        ("", PROBLEM, 0.0),
        ("(7-3)*(8-2)", None, 0.0),
    ],
)
def test_countdown(completion, truth, score):
    assert countdown(completion, truth) == score


def test_countdown_may_leave_numbers_unused():
    assert countdown("<answer>3 * 8</answer>", PROBLEM, use_all=False) == 1.0


# --------------------------------------------------------------------------- registry


def test_every_spec_example_name_is_registered():
    # the names RewardFunctionSpec's documentation and default use
    for name in ("math_accuracy", "format", "exact_match"):
        assert get_reward(name) is REWARDS[name]


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_every_reward_has_the_one_signature(name):
    params = list(inspect.signature(REWARDS[name]).parameters.values())
    assert [p.name for p in params[:2]] == ["completion", "ground_truth"]
    assert all(p.kind is p.KEYWORD_ONLY for p in params[2:])


@pytest.mark.parametrize("name", sorted(REWARDS))
def test_every_reward_scores_an_empty_response_zero(name):
    assert REWARDS[name]("", "1") == 0.0


def test_an_unknown_name_is_refused_with_the_valid_names():
    with pytest.raises(UnknownRewardError) as caught:
        get_reward("math_acuracy")
    message = str(caught.value)
    assert "'math_acuracy'" in message
    for name in reward_names():
        assert name in message
    assert isinstance(caught.value, KeyError)


def test_unknown_keyword_arguments_are_refused_with_the_valid_ones():
    with pytest.raises(TypeError, match="ignore_case, from_answer_tag, ignore_think"):
        check_kwargs("exact_match", exact_match, {"case_insensitive": True})
    check_kwargs("exact_match", exact_match, {"ignore_case": True})
