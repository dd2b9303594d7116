"""The code-execution reward runs the response's program on the test cases in the sandbox."""

from __future__ import annotations

import json
import time

import pytest

from rl_core.rewards import REWARDS, RewardComposer, code_execution, last_code_block
from rl_core.rewards.registry import CHEAP_REWARDS

FAST = {"cpu_time_s": 1, "wall_time_s": 2, "memory_mb": 256}
CASES = [{"input": "3\n", "output": "6"}, {"input": "5\n", "output": "10\n"},
         {"input": "-1\n", "output": "-2"}]


def fenced(code: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{code}\n```\nDone."


def test_it_is_registered_and_pooled():
    assert REWARDS["code_execution"] is code_execution
    assert "code_execution" not in CHEAP_REWARDS


def test_the_last_python_block_is_the_program():
    text = "```python\nprint(1)\n```\ntext ```inline``` and\n```py\nprint(2)\n```\n```\nplain\n```"
    assert last_code_block(text) == "print(2)\n"
    assert last_code_block("```\nprint(3)\n```") == "print(3)\n"
    assert last_code_block("```python\nprint(1)") is None
    assert last_code_block("no code") is None


def test_passing_code_scores_one():
    assert code_execution(fenced("print(int(input()) * 2)"), CASES, **FAST) == 1.0


def test_the_ground_truth_may_be_json_text():
    assert code_execution(fenced("print(int(input()) * 2)"), json.dumps(CASES), **FAST) == 1.0


def test_wrong_output_scores_the_fraction_passed():
    code = fenced("n = int(input())\nprint(n * 2 if n > 0 else 0)")
    assert code_execution(code, CASES, **FAST) == pytest.approx(2 / 3)
    assert code_execution(code, CASES, all_or_nothing=True, **FAST) == 0.0


def test_a_crash_fails_its_case():
    code = fenced("n = int(input())\nassert n != 5\nprint(n * 2)")
    assert code_execution(code, CASES, **FAST) == pytest.approx(2 / 3)


def test_no_code_scores_zero():
    assert code_execution("the answer is 6", CASES, **FAST) == 0.0
    assert code_execution("<think>```python\nprint(6)\n```", CASES, **FAST) == 0.0


def test_the_whole_completion_can_be_the_program():
    assert code_execution("print(int(input()) * 2)", CASES, whole_completion=True,
                          **FAST) == 1.0


def test_an_endless_loop_scores_zero_without_stalling():
    started = time.monotonic()
    score = code_execution(fenced("while True:\n    pass"), CASES[:2], **FAST)
    assert score == 0.0
    assert time.monotonic() - started < 60  # generous: each case was stopped


def test_through_the_composer_an_endless_loop_scores_zero_and_others_score():
    good, endless = fenced("print(int(input()) * 2)"), fenced("import time\ntime.sleep(600)")
    functions = [{"name": "code_execution", "kwargs": FAST}]
    with RewardComposer(functions, timeout_s=30, num_workers=2) as composer:
        scores = composer.score_batch([good, endless], [CASES, CASES])
    assert scores.per_function["code_execution"] == [1.0, 0.0]
    assert (scores.timeouts, scores.errors) == (0, 0)


@pytest.mark.parametrize("truth, says", [
    ("not json", "not JSON"),
    ([], "non-empty list"),
    ({"input": "1", "output": "2"}, "non-empty list"),
    ([{"input": "1"}], "test case 0"),
    ([{"input": 1, "output": "2"}], "input must be text"),
    (None, "non-empty list"),
])
def test_a_malformed_ground_truth_is_an_error_naming_it(truth, says):
    with pytest.raises(ValueError, match=says):
        code_execution(fenced("print(1)"), truth, **FAST)
