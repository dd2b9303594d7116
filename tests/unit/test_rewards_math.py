"""Answer extraction, answer equivalence and the math_accuracy reward, as tables."""

import time

import pytest

from rl_core.rewards import answers_match, extract_answer, math_accuracy, parse_number
from rl_core.rewards.extract import last_boxed, last_number, strip_reasoning

# --------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("The answer is \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("nested \\boxed{\\frac{\\sqrt{3}}{2}} done", "\\frac{\\sqrt{3}}{2}"),
        ("first \\boxed{3}, then \\boxed{4}", "4"),  # several boxes: the last one
        ("\\boxed{3} then \\boxed{4", "3"),  # an unclosed box is skipped
        ("\\boxed{4", "4"),  # no well-formed box at all: the last number
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces are text
        ("\\fbox{7}", "7"),
        ("\\boxed 5", "5"),
        ("She pays 3 + 4 = 7 dollars.\n#### 7", "7"),
        ("#### 1,000", "1,000"),
        ("#### $1,000.", "1,000"),
        ("#### -3\n", "-3"),
        ("<answer>42</answer>", "42"),
        ("<answer>The final answer is 42.</answer>", "42"),
        ("<answer>She has 42 apples</answer>", "42"),  # prose in the tag: its last number
        ("<answer>\\frac{1}{2}</answer>", "\\frac{1}{2}"),  # a formula: the whole content
        ("<answer>x^2 + 1</answer>", "x^2 + 1"),
        ("<answer>5 \\text{ cm}</answer>", "5 \\text{ cm}"),
        ("<answer>so \\boxed{9}</answer> and then 10", "9"),  # the tag wins over later text
        ("<answer>1</answer><answer>2</answer>", "2"),
        ("<think>it is 41</think><answer>42</answer>", "42"),
        ("<think>maybe \\boxed{41}</think> so 42", "42"),  # numbers in the reasoning do not count
        ("<think>the answer is 42</think>", None),  # answer only inside the reasoning
        ("<think><answer>42</answer></think>", None),  # an answer tag inside the reasoning
        ("<think>cut off while thinking about 42", None),  # unclosed think
        ("We add 12 and 30 to get 42.", "42"),  # reasoning numbers vs the final one
        ("x = -3", "-3"),
        ("5-3", "3"),  # a binary minus is not a sign
        ("(-3)", "-3"),
        ("The total is 1,000 dollars", "1,000"),
        ("1,2,3", "3"),
        ("pi is about 3.14159", "3.14159"),
        ("the ratio is 3/4", "3/4"),
        ("a rise of 50%", "50%"),
        ("so it is \\frac{1}{2}.", "\\frac{1}{2}"),
        ("so it is -\\frac{1}{2}", "-\\frac{1}{2}"),
        ("", None),
        ("no digits here", None),
        ("\\boxed{}", None),
    ],
)
def test_it_extracts_the_final_answer(completion, expected):
    assert extract_answer(completion) == expected


def test_it_reads_the_reasoning_when_asked():
    assert extract_answer("<think>the answer is 42</think>", ignore_think=False) == "42"


@pytest.mark.parametrize(
    "text, expected",
    [("a</think>b", "b"), ("a</think>b</think>c", "c"), ("<think>a", None), ("plain", "plain")],
)
def test_it_strips_the_reasoning(text, expected):
    assert strip_reasoning(text) == expected


def test_helpers_return_none_without_a_match():
    assert last_boxed("no box") is None
    assert last_number("no number") is None


# --------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize(
    "pred, gold, same",
    [
        ("42", "42", True),
        ("1,000", "1000", True),
        ("1000", "1,000", True),
        ("1,000,000", "1000000", True),
        ("\\$1,000", "1000", True),
        ("0.5", "\\frac{1}{2}", True),
        ("\\frac{1}{2}", "0.5", True),
        ("\\dfrac{3}{4}", "0.75", True),
        ("\\frac34", "3/4", True),
        ("-\\frac{1}{2}", "-0.5", True),
        ("\\frac{-1}{2}", "-1/2", True),
        ("2.0", "2", True),
        ("-3", "3", False),
        ("3", "-3", False),
        ("\u22123", "-3", True),  # unicode minus
        ("50%", "50", True),
        ("50\\%", "0.5", True),
        ("0.333333", "1/3", True),  # rounded to 6 decimals, as math-verify
        ("0.33", "1/3", False),
        ("10", "10.5", False),
        ("123456789012345678", "123456789012345679", False),  # integers compare exactly
        ("$5$", "5", True),
        ("5.", "5", True),
        ("1/0", "1", False),
        ("A", "A", True),
        ("B", "A", False),
        ("\\sqrt{12}", "2\\sqrt{3}", True),
        ("3\\sqrt{2}", "\\sqrt{18}", True),
        ("\\frac{\\sqrt3}{2}", "\\frac{\\sqrt{3}}{2}", True),
        ("10^{3}", "1000", True),
        ("x^2+2x+1", "(x+1)^2", True),
        ("x=3", "3", True),
        ("(1,2)", "(1, 2)", True),
        ("\\pi", "3.14", False),
        ("5 \\text{ cm}", "5", True),
        ("", "1", False),
        ("1", "", False),
        (None, "1", False),
        ("1", None, False),
    ],
)
def test_it_judges_equivalence(pred, gold, same):
    assert answers_match(pred, gold) is same


@pytest.mark.parametrize(
    "text, value",
    [
        ("1,000", (1000, False)),
        ("-2.5", (-2.5, False)),
        ("3/4", (0.75, False)),
        ("\\frac{3}{4}", (0.75, False)),
        ("50\\%", (50, True)),
        ("x", None),
        ("\\sqrt{2}", None),
        ("1,00", None),  # not a thousands grouping
    ],
)
def test_it_parses_plain_numbers(text, value):
    parsed = parse_number(text)
    assert (parsed if parsed is None else (float(parsed[0]), parsed[1])) == value


# --------------------------------------------------------------------------- math_accuracy


@pytest.mark.parametrize(
    "completion, truth, score",
    [
        ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("<think>try 41</think><answer>42</answer>", "42", 1.0),
        ("<think>the answer is 42</think>", "42", 0.0),
        ("<think>the answer is 42</think><answer>41</answer>", "42", 0.0),
        ("It costs $1,000.\n#### 1,000", "1000", 1.0),
        ("\\boxed{3}", "-3", 0.0),
        ("\\boxed{-3}", "-3", 1.0),
        ("step 1 gives 12, step 2 gives 30, so 42", "42", 1.0),
        ("the answer is 42, not 41", "42", 0.0),  # the last number is taken
        ("", "42", 0.0),
        ("\\boxed{42}", None, 0.0),
        ("\\boxed{42}", 42, 1.0),  # a numeric reference
        ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}", 1.0),
        # a full reference solution is reduced to its final answer
        ("\\boxed{72}", "48 + 24 = 72 clips.\n#### 72", 1.0),
        ("\\boxed{\\frac{1}{4}}", "The probability is $\\boxed{\\dfrac{1}{4}}$.", 1.0),
    ],
)
def test_math_accuracy(completion, truth, score):
    assert math_accuracy(completion, truth) == score


def test_an_overlong_answer_is_compared_as_text_only():
    long = "1" * 5000
    assert math_accuracy(f"\\boxed{{{long}}}", long) == 1.0
    assert math_accuracy(f"\\boxed{{{long}}}", "1") == 0.0


@pytest.mark.parametrize(
    "completion",
    [
        "x" * 1_000_000,
        "1" * 1_000_000,
        "1," * 500_000,
        "\\boxed{" * 100_000,
        "{" * 500_000 + "}" * 499_999,
        "<answer>" * 100_000,
        "<think>" + "a" * 1_000_000,
        "- " * 500_000,
    ],
    ids=["letters", "digits", "commas", "open-boxes", "braces", "answer-tags", "think", "minus"],
)
def test_a_megabyte_response_is_scored_quickly(completion):
    # linear-time extraction: no regular-expression backtracking over the whole response
    start = time.perf_counter()
    assert math_accuracy(completion, "42") == 0.0
    assert time.perf_counter() - start < 2.0
