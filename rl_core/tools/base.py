"""What a tool is: a name, an OpenAI function schema, and a call that never raises.

    class Echo(FunctionTool):
        name = "echo"
        description = "Repeat a text."
        parameters = {"type": "object", "properties": {"text": {"type": "string"}},
                      "required": ["text"], "additionalProperties": False}

        def run(self, text: str) -> ToolResult:
            return ToolResult(text, OK)

    Echo()({"text": "hi"})        # ToolResult(text="hi", status="ok")
    Echo()({"txt": "hi"})         # status "bad_arguments", the text names txt and text

A call's arguments are a mapping, or the JSON text of one (as models write tool calls). Any
failure becomes a `ToolResult` whose text the model reads and whose status says what failed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

OK, BAD_ARGUMENTS, ERROR = "ok", "bad_arguments", "error"
TOOL_STATUSES = (OK, BAD_ARGUMENTS, ERROR, "timeout", "memory", "output", "refused")
MAX_TEXT_CHARS = 16_384  # what one result may show the model

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "object": (Mapping,), "array": (list, tuple), "null": (type(None),),
}


@dataclass(frozen=True)
class ToolResult:
    """text: what the model reads; status: "ok" or the failure kind (`TOOL_STATUSES`)."""

    text: str
    status: str = OK

    @property
    def ok(self) -> bool:
        return self.status == OK


@runtime_checkable
class Tool(Protocol):
    """A tool: `name`, `schema()` (an OpenAI function schema) and `__call__(arguments)`, which
    never raises (failures are a ToolResult with an error text and status)."""

    name: str

    def schema(self) -> dict: ...

    def __call__(self, arguments: Mapping[str, Any]) -> ToolResult: ...


class FunctionTool:
    """A tool from a name, a description, a JSON-schema of its arguments and `run(**arguments)`;
    arguments are checked against the schema's properties, `required` and types first."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    parameters: ClassVar[dict[str, Any]] = {"type": "object", "properties": {}}

    def schema(self) -> dict:
        return function_schema(self.name, self.description, self.parameters)

    def __call__(self, arguments: Mapping[str, Any] | str) -> ToolResult:
        parsed, problem = parse_arguments(self.name, self.parameters, arguments)
        if problem is not None:
            return ToolResult(problem, BAD_ARGUMENTS)
        try:
            return self.run(**parsed)
        except Exception as error:  # noqa: BLE001 - a tool never raises to the rollout
            return ToolResult(f"{self.name} failed: {type(error).__name__}: {error}"[:2000],
                              ERROR)

    def run(self, **arguments: Any) -> ToolResult:
        raise NotImplementedError


def function_schema(name: str, description: str, parameters: Mapping[str, Any]) -> dict:
    """The OpenAI function-calling schema of a tool."""
    return {"type": "function", "function": {
        "name": name, "description": description, "parameters": dict(parameters)}}


def parse_arguments(name: str, parameters: Mapping[str, Any], arguments: Any
                    ) -> tuple[dict[str, Any], str | None]:
    """(arguments as a dict, None), or ({}, a text for the model naming what is wrong): not a
    mapping (or JSON of one), unknown names, missing required ones, a value of the wrong
    JSON type."""
    if isinstance(arguments, str | bytes):
        try:
            arguments = json.loads(arguments)
        except ValueError as error:
            return {}, f"{name}: the arguments are not valid JSON ({error}): pass an object"
    if not isinstance(arguments, Mapping):
        return {}, (f"{name}: the arguments must be an object of named values, got "
                    f"{type(arguments).__name__}")
    properties = parameters.get("properties") or {}
    given = dict(arguments)
    unknown = sorted(str(k) for k in given if k not in properties)
    missing = [k for k in parameters.get("required") or () if k not in given]
    problems = []
    if unknown and (properties or parameters.get("additionalProperties") is False):
        problems.append(f"unknown argument(s) {', '.join(unknown)}")
    if missing:
        problems.append(f"missing required argument(s) {', '.join(missing)}")
    for key, value in given.items():
        expected = (properties.get(key) or {}).get("type") if key in properties else None
        if isinstance(expected, str) and expected in _JSON_TYPES:
            types = _JSON_TYPES[expected]
            wrong = not isinstance(value, types) or (
                expected in ("integer", "number") and isinstance(value, bool))
            if wrong:
                problems.append(f"argument {key} must be a JSON {expected}, got "
                                f"{type(value).__name__}")
    if problems:
        valid = ", ".join(properties) or "(none)"
        return {}, f"{name}: {'; '.join(problems)} (its arguments: {valid})"
    return given, None


def cut(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`text`, or its first `limit` characters and a note of how much was left out."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters not shown]"


__all__ = ["BAD_ARGUMENTS", "ERROR", "FunctionTool", "OK", "TOOL_STATUSES", "Tool", "ToolResult",
           "function_schema", "parse_arguments"]
