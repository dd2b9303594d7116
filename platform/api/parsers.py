"""Strict JSON for the API: no NaN or Infinity, bounded nesting, refused before any view runs."""

from __future__ import annotations

import codecs
import json
import math
from typing import Any

from django.conf import settings
from rest_framework import exceptions, parsers

MAX_JSON_DEPTH = 32  # nesting levels of objects and arrays in a body; the body itself is level 1


class JSONLimitError(ValueError):
    """Valid JSON the API does not accept; `field` is the dotted path of the value ("" for the
    whole body)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}" if field else message)
        self.field, self.message = field, message


class _NonFinite:
    """What NaN, Infinity, -Infinity or an overflowing number such as 1e999 decode to, so that
    the scan can name the field that holds it."""

    def __init__(self, text: str):
        self.text = text


def _parse_float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def loads(text: str | bytes) -> Any:
    """`json.loads`, refusing NaN, Infinity (and numbers that overflow to it) and nesting deeper
    than MAX_JSON_DEPTH with a JSONLimitError; syntax errors stay json.JSONDecodeError."""
    try:
        data = json.loads(text, parse_constant=_NonFinite, parse_float=_parse_float)
    except RecursionError:
        raise JSONLimitError(
            "", f"the JSON is nested deeper than the limit of {MAX_JSON_DEPTH} levels"
        ) from None
    problem = _scan(data)
    if problem:
        raise JSONLimitError(*problem)
    return data


def _scan(data: Any) -> tuple[str, str] | None:
    """The first (path, problem) in decoded JSON, found without recursion."""
    stack: list[tuple[tuple[str, ...], Any, int]] = [((), data, 1)]
    while stack:
        path, node, depth = stack.pop()
        if isinstance(node, _NonFinite):
            return ".".join(path), (
                f"{node.text} is not a finite number: JSON numbers must be finite, send a number "
                "or null"
            )
        if isinstance(node, dict):
            children: Any = node.items()
        elif isinstance(node, list):
            children = enumerate(node)
        else:
            continue
        if depth > MAX_JSON_DEPTH:
            return ".".join(path[:MAX_JSON_DEPTH]), (
                f"nested deeper than the limit of {MAX_JSON_DEPTH} levels: flatten it"
            )
        stack.extend(((*path, str(key)), child, depth + 1) for key, child in children)
    return None


class StrictJSONDecoder(json.JSONDecoder):
    """For `serializers.JSONField(decoder=...)`: the same rules for JSON sent as a form value."""

    def decode(self, s: str, _w: Any = None) -> Any:
        return loads(s)


class StrictJSONParser(parsers.JSONParser):
    """DRF's JSON parser with `loads`: a refused value is a 400 naming its field."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            return loads(codecs.getreader(encoding)(stream).read())
        except JSONLimitError as exc:
            raise exceptions.ValidationError({exc.field: [exc.message]} if exc.field
                                             else [exc.message]) from None
        except ValueError as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
