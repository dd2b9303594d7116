"""The rule-based reward functions. Each has the one signature of `RewardFn`:

    fn(completion: str, ground_truth, **kwargs) -> float

`completion` is the decoded response (prompt excluded), `ground_truth` the record's answer field
(text; a mapping or its JSON for structured tasks such as countdown; None when the record has
none), and `kwargs` the `reward.functions[i].kwargs` of the run spec. They are pure and
deterministic, and evaluation calls the very same functions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rl_core.rewards.equivalence import answers_match
from rl_core.rewards.extract import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    answer_tag,
    extract_answer,
    gsm8k_answer,
    last_boxed,
    strip_reasoning,
)


def math_accuracy(
    completion: str,
    ground_truth: Any,
    *,
    ignore_think: bool = True,
    max_answer_chars: int = 1000,
) -> float:
    """1.0 when the response's final answer equals the reference mathematically, else 0.0.

    The answer is found by `extract_answer` (after `</think>`; `<answer>`, `\\boxed{}`, `####`,
    last number). A reference written as a full solution is reduced the same way (its last
    `\\boxed{}` or `####` line). An answer longer than `max_answer_chars` is only compared as
    text, never parsed. No reference scores 0.0.
    """
    if ground_truth is None:
        return 0.0
    gold = str(ground_truth)
    gold = last_boxed(gold) or gsm8k_answer(gold) or gold
    pred = extract_answer(completion, ignore_think=ignore_think)
    if pred is None:
        return 0.0
    if len(pred) > max_answer_chars:
        return float(pred.strip() == gold.strip())
    return float(answers_match(pred, gold))


def format_strict(
    completion: str, ground_truth: Any = None, *, think_in_prompt: bool = False
) -> float:
    """1.0 for exactly `<think>…</think><answer>…</answer>` (whitespace around and between the
    blocks allowed, nothing else; each tag once; a non-empty answer), else 0.0.

    With `think_in_prompt` the prompt already ends with `<think>` (R1-Zero style templates), so
    the response must start inside the reasoning: `…</think><answer>…</answer>`.
    """
    text = (THINK_OPEN + completion if think_in_prompt else completion).strip()
    if any(text.count(tag) != 1 for tag in (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)):
        return 0.0
    if not (text.startswith(THINK_OPEN) and text.endswith(ANSWER_CLOSE)):
        return 0.0
    think_end, answer_start = text.index(THINK_CLOSE), text.index(ANSWER_OPEN)
    if answer_start < think_end or text[think_end + len(THINK_CLOSE) : answer_start].strip():
        return 0.0
    return float(bool(text[answer_start + len(ANSWER_OPEN) : -len(ANSWER_CLOSE)].strip()))


def format_lenient(
    completion: str, ground_truth: Any = None, *, think_in_prompt: bool = False
) -> float:
    """1.0 when a think block is followed by a non-empty answer block anywhere in the response
    (other text around them allowed), else 0.0. `think_in_prompt` as in `format_strict`."""
    start = 0 if think_in_prompt else completion.find(THINK_OPEN)
    think_end = completion.find(THINK_CLOSE, max(start, 0)) if start >= 0 else -1
    if think_end < 0:
        return 0.0
    answer = answer_tag(completion[think_end:])
    return float(bool(answer and answer.strip()))


def exact_match(
    completion: str,
    ground_truth: Any,
    *,
    ignore_case: bool = False,
    from_answer_tag: bool = True,
    ignore_think: bool = True,
) -> float:
    """1.0 when the response equals the reference after trimming and collapsing whitespace.

    With `ignore_think` only the text after `</think>` counts (an unclosed `<think>` scores 0);
    with `from_answer_tag` the content of the last `<answer>…</answer>`, when there is one, is
    compared instead of the whole text. `ignore_case` compares case-insensitively.
    """
    if ground_truth is None:
        return 0.0
    text = strip_reasoning(completion) if ignore_think else completion
    if text is None:
        return 0.0
    if from_answer_tag and (tagged := answer_tag(text)) is not None:
        text = tagged
    return float(_squash(text, ignore_case) == _squash(str(ground_truth), ignore_case))


def _squash(s: str, ignore_case: bool) -> str:
    s = " ".join(s.split())
    return s.casefold() if ignore_case else s


def countdown(
    completion: str, ground_truth: Any, *, use_all: bool = True, ignore_think: bool = True
) -> float:
    """1.0 when the response's expression reaches the target with the given numbers, else 0.0.

    `ground_truth` is `{"target": 24, "numbers": [3, 7, 8, 2]}` (or its JSON text), as the
    synthetic countdown task writes it. The expression is the `<answer>` content, else the last
    non-empty line; a trailing `= 24` is dropped. `use_all`: every number exactly once.
    """
    from rl_core.data.synthetic import verify_countdown

    problem = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if not isinstance(problem, Mapping) or "target" not in problem or "numbers" not in problem:
        return 0.0
    text = strip_reasoning(completion) if ignore_think else completion
    if text is None:
        return 0.0
    expression = answer_tag(text)
    if expression is None:
        lines = [line for line in text.splitlines() if line.strip()]
        expression = lines[-1] if lines else ""
    expression = expression.split("=", 1)[0]
    ok = verify_countdown(expression, problem["numbers"], problem["target"], use_all=use_all)
    return float(ok)
