"""The code-execution reward: run the response's program on test cases in the sandbox.

    code_execution("```python\\nprint(int(input()) * 2)\\n```",
                   [{"input": "3\\n", "output": "6"}, {"input": "5\\n", "output": "10"}])  # 1.0

    reward:
      timeout_s: 60            # covers every case: cases × wall_time_s, plus start-up
      functions:
        - name: code_execution
          kwargs: {all_or_nothing: false, wall_time_s: 5, cpu_time_s: 5, memory_mb: 512}

The program is the last fenced block marked python (or py), else the last unmarked fenced block,
of the text after the reasoning (`whole_completion: true` runs the whole response instead). Each
test case runs it in a fresh sandbox (`rl_core.tools.sandbox`) with the case's input on stdin; a
case passes when the program ends normally and its stdout equals the expected output, both with
surrounding whitespace and trailing spaces of each line removed. The score is the fraction of
cases passed, or with `all_or_nothing` 1.0 only when all pass (it stops at the first failure).
No program scores 0.0 (whatever the ground truth).

The composer's per-call limit, `reward.timeout_s`, bounds the whole call, every case included:
set it above the number of cases times `wall_time_s` (plus a second for each start), or calls
with many slow cases are cut off and score 0 as timeouts. Run it in the worker pool (its
default), never `in_process`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rl_core.rewards.extract import strip_reasoning

FENCE = "```"
PYTHON_TAGS = frozenset({"python", "py", "python3"})


def last_code_block(text: str) -> str | None:
    """The content of the last ```python (or ```py, ```python3) block; failing that, of the
    last block without a language; None when there is neither. An unclosed fence is ignored.
    Linear in the text."""
    fences, at = [], text.find(FENCE)
    while at >= 0:
        fences.append(at)
        at = text.find(FENCE, at + len(FENCE))
    tagged = plain = None
    for opening, closing in zip(fences[0::2], fences[1::2]):
        body = text[opening + len(FENCE): closing]
        info, newline, code = body.partition("\n")
        if not newline:  # ```inline``` on one line: no program
            continue
        tag = info.strip().lower()
        if tag in PYTHON_TAGS:
            tagged = code
        elif not tag:
            plain = code
    return tagged if tagged is not None else plain


def parse_test_cases(ground_truth: Any) -> list[tuple[str, str]]:
    """[(stdin, expected stdout)] from a list of {"input": ..., "output": ...} or its JSON text;
    ValueError naming what is wrong otherwise."""
    cases = ground_truth
    if isinstance(cases, str | bytes):
        try:
            cases = json.loads(cases)
        except ValueError as error:
            raise ValueError(f"code_execution: the ground truth is not JSON ({error}): give a "
                             'list of {"input": ..., "output": ...}') from None
    if not isinstance(cases, Sequence) or isinstance(cases, str | bytes) or not cases:
        raise ValueError('code_execution: the ground truth must be a non-empty list of '
                         f'{{"input": ..., "output": ...}}, got {_kind(cases)}')
    out = []
    for i, case in enumerate(cases):
        if not isinstance(case, Mapping) or "output" not in case:
            raise ValueError(f"code_execution: test case {i} must be a mapping with an "
                             f'"output" (and an optional "input"), got {_kind(case)}')
        stdin, expected = case.get("input", ""), case["output"]
        if not isinstance(stdin, str) or not isinstance(expected, str | int | float):
            raise ValueError(f"code_execution: test case {i}: input must be text and output "
                             "text or a number")
        out.append((stdin, str(expected)))
    return out


def _kind(value: Any) -> str:
    return repr(value)[:80] if isinstance(value, Sequence) else type(value).__name__


def same_output(actual: str, expected: str) -> bool:
    """Equal after removing surrounding whitespace and the trailing spaces of each line."""
    def norm(text: str) -> list[str]:
        return [line.rstrip() for line in text.strip().splitlines()]

    return norm(actual) == norm(expected)


def code_execution(
    completion: str,
    ground_truth: Any,
    *,
    all_or_nothing: bool = False,
    whole_completion: bool = False,
    ignore_think: bool = True,
    cpu_time_s: float = 5.0,
    memory_mb: int = 512,
    wall_time_s: float = 10.0,
) -> float:
    """Fraction of the test cases in `ground_truth` the response's program passes (see the
    module's docstring); ValueError for a malformed ground truth (when there is a program)."""
    from rl_core.tools.sandbox import SandboxLimits, run_python

    text = strip_reasoning(completion) if ignore_think else completion
    code = None if text is None else text if whole_completion else last_code_block(text)
    if code is None or not code.strip():
        return 0.0
    cases = parse_test_cases(ground_truth)
    limits = SandboxLimits(cpu_time_s=cpu_time_s, memory_mb=memory_mb, wall_time_s=wall_time_s,
                           output_bytes=max(4096, 2 * max(len(e) for _, e in cases) + 1024))
    passed = 0
    for stdin, expected in cases:
        result = run_python(code, limits, stdin=stdin)
        if result.status == "ok" and same_output(result.stdout, expected):
            passed += 1
        elif all_or_nothing:
            return 0.0
    return passed / len(cases) if not all_or_nothing else 1.0


__all__ = ["code_execution", "last_code_block", "same_output", "parse_test_cases"]
