"""Rules for text a person types that every app shares."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.utils.deconstruct import deconstructible

from rl_core.spec import PLAIN_TEXT_PATTERN, plain_text_problem


@deconstructible
class PlainText(RegexValidator):
    """A name is one line of plain text: no control character (NUL, newline, escape), no line
    separator, no bidirectional control such as a right-to-left override; the same rule as a
    run spec's name (rl_core.spec.plain_text_problem). The pattern is what the OpenAPI document
    shows; the refusal names the character."""

    regex = PLAIN_TEXT_PATTERN
    code = "plain_text"

    def __init__(self):
        super().__init__()

    def __call__(self, value) -> None:
        problem = plain_text_problem(str(value))
        if problem:
            raise ValidationError(f"{str(value)!r} {problem}.", code=self.code)


plain_text = PlainText()
