"""Is a predicted answer the same mathematical value as the reference?

Three steps, cheapest first:
1. plain numbers (`1,000`, `-2.5`, `3/4`, `\\frac{1}{2}`, `50%`) are compared exactly as fractions;
2. otherwise the two strings are compared after LaTeX normalisation (`\\dfrac` -> `\\frac`, no
   `\\left`, spaces, outer `$`, …), which settles multiple-choice letters and identical formulas;
3. otherwise both are parsed with math-verify and compared symbolically (`\\sqrt{12}` vs
   `2\\sqrt{3}`, `x=3` vs `3`, intervals, sets).

math-verify's own time limits use SIGALRM, which only works in a process's main thread; they are
switched off here, and `RewardComposer` enforces the time limit by running scoring in worker
processes it can kill. Called directly, a pathological answer (`9^{9^{9^{9}}}`) can run for a
long time.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction
from typing import Any

_INT = r"-?\d+"
_PLAIN_RE = re.compile(r"-?(?:\d+(?:\.\d+)?|\.\d+)")
_GROUPED_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_RATIO_RE = re.compile(r"(-?\d+)/(-?\d+)")
_FRAC_RE = re.compile(rf"(-)?\\frac(?:\{{({_INT})\}}|(\d))(?:\{{({_INT})\}}|(\d))")
_TEXT_RE = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_SPACING_RE = re.compile(r"\\[,;:! ]|\\q?quad|\\left|\\right|\s+")
# Fraction comparison rounds non-integers to this many decimals (as math-verify's float_rounding).
DECIMALS = 6


def normalise(answer: str) -> str:
    """A canonical spelling: no spacing macros, outer `$`, `\\text{}` wrappers, `^\\circ`,
    trailing period; `\\dfrac`/`\\tfrac` -> `\\frac`; unicode minus -> `-`."""
    s = answer.strip().replace("\u2212", "-").replace("\\$", "")
    s = _TEXT_RE.sub(r"\1", s)
    s = _SPACING_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("°", "")
    s = s.strip("$").rstrip(".")
    return s


def parse_number(answer: str) -> tuple[Fraction, bool] | None:
    """(exact value, written as a percentage) for a plain number, else None.

    `1,000` -> 1000; `-2.5` -> -5/2; `3/4` and `\\frac{3}{4}` and `\\frac34` -> 3/4; `50%` and
    `50\\%` -> (50, True). Anything else (letters, roots, powers) is None.
    """
    s = normalise(answer)
    percent = s.endswith("%")
    s = s.removesuffix("%").removesuffix("\\")
    if s.startswith("(") and s.endswith(")"):
        s = s[1:-1]
    if _GROUPED_RE.fullmatch(s):
        s = s.replace(",", "")
    try:
        if _PLAIN_RE.fullmatch(s):
            return Fraction(s), percent
        if m := _RATIO_RE.fullmatch(s):
            return Fraction(int(m[1]), int(m[2])), percent
        if m := _FRAC_RE.fullmatch(s):
            value = Fraction(int(m[2] or m[3]), int(m[4] or m[5]))
            return (-value if m[1] else value), percent
    except ZeroDivisionError:
        return None
    return None


def _numbers_equal(pred: tuple[Fraction, bool], gold: tuple[Fraction, bool]) -> bool:
    """Exact equality, or equality after rounding to DECIMALS when either is not an integer.
    A percentage also matches its fraction: 50% equals 50 and 0.5."""

    def readings(v: tuple[Fraction, bool]) -> list[Fraction]:
        return [v[0], v[0] / 100] if v[1] else [v[0]]

    for a in readings(pred):
        for b in readings(gold):
            if a == b:
                return True
            if (a.denominator != 1 or b.denominator != 1) and round(a, DECIMALS) == round(
                b, DECIMALS
            ):
                return True
    return False


def answers_match(pred: str | None, gold: str | None) -> bool:
    """True when `pred` has the same value as `gold` (see the module docstring)."""
    if pred is None or gold is None:
        return False
    p, g = normalise(pred), normalise(gold)
    if not p or not g:
        return False
    pn, gn = parse_number(pred), parse_number(gold)
    if pn is not None and gn is not None:
        return _numbers_equal(pn, gn)
    if p == g:
        return True
    return _symbolic_match(_light(pred), _light(gold))


def _light(answer: str) -> str:
    """The answer as given to math-verify: only outer `$` and a trailing period removed (it
    understands `\\left`, `\\text` and spacing itself; dropping spaces could join `\\pi r`)."""
    return answer.strip().strip("$").strip().rstrip(".")


# --------------------------------------------------------------------------- math-verify


@functools.cache
def _math_verify() -> Any:
    """math-verify, imported on first use (it pulls in sympy and an ANTLR LaTeX parser)."""
    import math_verify
    import math_verify.grader
    import math_verify.parser

    # Time limits are enforced by the caller (see the module docstring): with them switched off,
    # math-verify warns once per process; it has been told.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


@functools.lru_cache(maxsize=4096)
def _parse(answer: str) -> tuple[Any, ...]:
    """math-verify's parse of one answer, boxed so the whole string is the expression."""
    mv = _math_verify()
    config = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    return tuple(mv.parse(f"\\boxed{{{answer}}}", extraction_config=config, parsing_timeout=None))


def _symbolic_match(pred: str, gold: str) -> bool:
    gold_parsed, pred_parsed = _parse(gold), _parse(pred)
    if not gold_parsed or not pred_parsed:
        return False
    mv = _math_verify()
    return bool(mv.verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None))


def warm_up() -> None:
    """Import math-verify and run one symbolic comparison (the first one pays ANTLR's set-up)."""
    _symbolic_match("x+1", "1+x")
