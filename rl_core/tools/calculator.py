"""Exact arithmetic on a line of text, without `eval`: the `calculator` tool.

    evaluate("1234*5678")      # "7006652"
    evaluate("0.1 + 0.2")      # "0.3"      (exact decimals)
    evaluate("1/3")            # "0.3333333333333333"  (no finite decimal: a float's digits)
    evaluate("2**0.5")         # "1.4142135623730951"
    evaluate("1/0")            # CalculatorError: division by zero

The expression is parsed with `ast` and only numbers (integers, decimals), + - * / // % **,
unary signs and parentheses are taken: a name, a call or anything else is refused before
anything is computed. Numbers are exact fractions throughout, so integer results are exact at
any size up to MAX_BITS; an integer power is capped the same way before it is computed.
"""

from __future__ import annotations

import ast
import math
import operator
from fractions import Fraction
from typing import Any

from rl_core.tools.base import BAD_ARGUMENTS, ERROR, OK, FunctionTool, ToolResult

MAX_CHARS = 1_000  # of one expression
MAX_BITS = 16_384  # of a result's numerator or denominator (about 4,900 decimal digits)

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """The expression cannot be computed; `bad_input`: it is not an arithmetic expression."""

    def __init__(self, message: str, bad_input: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input


def evaluate(expression: str) -> str:
    """The value of `expression` as text: an integer exactly, a fraction with a finite decimal
    expansion exactly, any other (and anything computed through a fractional power) as a
    float's shortest digits."""
    value, exact = compute(expression)
    if exact:
        return show(value)
    try:
        return repr(float(value))
    except OverflowError:
        raise _too_large() from None


def compute(expression: str) -> tuple[Fraction, bool]:
    """(the value, whether it is exact: no fractional power was taken on the way)."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("give an arithmetic expression such as 12*(3+4)", True)
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"the expression has {len(expression)} characters, more than "
                              f"the limit of {MAX_CHARS}", True)
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise CalculatorError(f"not an arithmetic expression: {error}", True) from None
    inexact: list[bool] = []
    try:
        return _value(tree.body, expression.strip(), inexact), not inexact
    except RecursionError:
        raise CalculatorError("the expression is nested too deeply", True) from None


def _value(node: ast.AST, source: str, inexact: list[bool]) -> Fraction:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalculatorError(f"only numbers are allowed, not {value!r}", True)
        if isinstance(value, int):
            return Fraction(value)
        text = (ast.get_source_segment(source, node) or repr(value)).replace("_", "")
        try:
            return Fraction(text)
        except ValueError:
            return Fraction(repr(value))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand, source, inexact))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left, source, inexact), _value(node.right, source, inexact)
        return _binary(type(node.op), left, right, inexact)
    shown = ast.get_source_segment(source, node) or type(node).__name__
    raise CalculatorError(f"{shown!r} is not allowed: use numbers, + - * / // % ** and "
                          "parentheses", True)


def _binary(op: type, left: Fraction, right: Fraction, inexact: list[bool]) -> Fraction:
    if op in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
        raise CalculatorError("division by zero")
    if op is ast.Mult and _bits(left) + _bits(right) > MAX_BITS:
        raise _too_large()
    if op is ast.Pow:
        return _power(left, right, inexact)
    return _checked(_BINARY[op](left, right))


def _power(base: Fraction, exponent: Fraction, inexact: list[bool]) -> Fraction:
    if exponent.denominator == 1:
        if base == 0 and exponent < 0:
            raise CalculatorError("division by zero (zero to a negative power)")
        if base in (0, 1, -1) or exponent == 0:
            return _checked(base ** int(exponent))
        if _bits(base) * abs(exponent.numerator) > MAX_BITS:
            raise _too_large()
        return _checked(base ** int(exponent))
    if base < 0:
        raise CalculatorError("a negative number to a fractional power is not a real number")
    try:
        value = math.pow(float(base), float(exponent))
    except (OverflowError, ValueError):
        raise _too_large() from None
    if not math.isfinite(value):
        raise _too_large()
    inexact.append(True)
    return Fraction(value)


def _bits(value: Fraction) -> int:
    return max(value.numerator.bit_length(), value.denominator.bit_length(), 1)


def _checked(value: Fraction) -> Fraction:
    if _bits(value) > MAX_BITS:
        raise _too_large()
    return value


def _too_large() -> CalculatorError:
    return CalculatorError(f"the result would be too large (more than {MAX_BITS} bits)")


def show(value: Fraction) -> str:
    """An integer as its digits; a fraction whose denominator has only the factors 2 and 5 as
    its exact decimal; any other as the shortest digits of the nearest float."""
    if value.denominator == 1:
        return str(value.numerator)
    d, twos, fives = value.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d != 1:
        try:
            return repr(float(value))
        except OverflowError:
            raise _too_large() from None
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10**places // value.denominator
    digits = str(scaled).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}".rstrip("0").rstrip(".")


class Calculator(FunctionTool):
    """The `calculator` tool: `{"expression": "12*(3+4)"}` -> "84"."""

    name = "calculator"
    description = ("Evaluate an arithmetic expression exactly: numbers (integers and "
                   "decimals), + - * / // % ** and parentheses; no names or functions.")
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string",
                                      "description": "The expression, e.g. 1234*5678."}},
        "required": ["expression"],
        "additionalProperties": False,
    }

    def __init__(self, limits: Any = None) -> None:
        self.limits = limits  # unused: the calculator runs in process, bounded by MAX_BITS

    def run(self, expression: str) -> ToolResult:
        try:
            return ToolResult(evaluate(expression), OK)
        except CalculatorError as error:
            return ToolResult(f"calculator: {error}", BAD_ARGUMENTS if error.bad_input else ERROR)


__all__ = ["Calculator", "CalculatorError", "MAX_BITS", "compute", "evaluate", "show"]
