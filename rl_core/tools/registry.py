"""The menu of tools: built-ins by name, and tools of installed packages by entry point.

    from rl_core.tools import get_tool, tool_names

    tool_names()                                   # ["calculator", "python", ...]
    python = get_tool("python", limits=SandboxLimits(wall_time_s=5))
    check_tool("calculator", {})                   # None, or InputError/TypeError naming it

A package adds a tool with an entry point in the group `ascent.tools` whose object is a
factory `factory(limits: SandboxLimits, **kwargs) -> Tool`:

    [project.entry-points."ascent.tools"]
    search = "my_package.tools:SearchTool"

A built-in name wins over an entry point of the same name (with a warning). Every tool that
`get_tool` returns never raises when called: a user tool's exception or a result that is not
a ToolResult becomes an error result, and arguments are checked against its schema first.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

from rl_core.errors import InputError
from rl_core.tools.base import BAD_ARGUMENTS, ERROR, Tool, ToolResult, cut, parse_arguments
from rl_core.tools.calculator import Calculator
from rl_core.tools.python import PythonTool
from rl_core.tools.sandbox import SandboxLimits

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "ascent.tools"
ToolFactory = Callable[..., Tool]

TOOLS: dict[str, ToolFactory] = {
    "python": PythonTool,
    "calculator": Calculator,
}


class UnknownToolError(InputError, KeyError):
    """A tool name that is neither built in nor an installed entry point; the message lists
    the valid names."""

    def __str__(self) -> str:
        return str(self.args[0])


def _entry_points() -> dict[str, metadata.EntryPoint]:
    found: dict[str, metadata.EntryPoint] = {}
    for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in TOOLS:
            logger.warning("the tool entry point %r (%s) has the name of a built-in tool, "
                           "which is used instead: rename it", entry.name, entry.value)
            continue
        found.setdefault(entry.name, entry)
    return found


def tool_names() -> list[str]:
    """Every tool name: the built-ins and the installed entry points, sorted."""
    return sorted(set(TOOLS) | set(_entry_points()))


def _factory(name: str) -> tuple[ToolFactory, bool]:
    """(the factory of `name`, whether it is a built-in)."""
    if not isinstance(name, str):
        raise UnknownToolError(f"a tool name must be text, got {type(name).__name__}")
    if name in TOOLS:
        return TOOLS[name], True
    entry = _entry_points().get(name)
    if entry is None:
        raise UnknownToolError(f"unknown tool {name!r}: choose one of {', '.join(tool_names())}"
                               f" (or install a package with an {ENTRY_POINT_GROUP!r} entry "
                               "point of that name)")
    try:
        factory = entry.load()
    except Exception as error:
        raise InputError(f"tool {name!r}: its entry point {entry.value} cannot be loaded: "
                         f"{type(error).__name__}: {error}") from error
    if not callable(factory):
        raise InputError(f"tool {name!r}: its entry point {entry.value} is not a factory "
                         "(a class or function taking limits and keyword arguments)")
    return factory, False


def check_tool(name: str, kwargs: Mapping[str, Any] | None = None) -> None:
    """Raise UnknownToolError (an InputError) for an unknown name, TypeError for keyword
    arguments the tool's factory does not take (naming those it takes). Builds nothing."""
    factory, _ = _factory(name)
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise TypeError(f"tool {name!r}: kwargs must be a mapping of names to values, got "
                        f"{kwargs!r}")
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a factory without a signature: checked when it is built
    try:
        signature.bind(SandboxLimits(), **kwargs)
    except TypeError:
        valid = [p.name for p in list(signature.parameters.values())[1:]
                 if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        raise TypeError(f"tool {name!r} does not take {sorted(kwargs)}: its keyword arguments "
                        f"are {', '.join(valid) or '(none)'}") from None


def get_tool(name: str, kwargs: Mapping[str, Any] | None = None,
             limits: SandboxLimits | None = None) -> Tool:
    """The tool `name` built with `limits` (default SandboxLimits()) and `kwargs`."""
    check_tool(name, kwargs)
    factory, builtin = _factory(name)
    tool = factory(limits or SandboxLimits(), **dict(kwargs or {}))
    return tool if builtin else GuardedTool(name, tool)


class GuardedTool:
    """A tool of an installed package, made to keep the contract: its arguments are checked
    against its schema, and an exception or a result that is not a ToolResult becomes an
    error result."""

    def __init__(self, name: str, tool: Any) -> None:
        for attribute in ("schema", "__call__"):
            if not callable(getattr(tool, attribute, None)):
                raise InputError(f"tool {name!r}: its factory built {type(tool).__name__}, "
                                 f"which has no {attribute}(): see rl_core.tools.base.Tool")
        self.name, self.tool = name, tool

    def schema(self) -> dict:
        return self.tool.schema()

    def __call__(self, arguments: Mapping[str, Any] | str) -> ToolResult:
        try:
            parameters = self.tool.schema()["function"].get("parameters") or {}
        except Exception as error:  # noqa: BLE001
            return ToolResult(f"{self.name}: its schema cannot be read: {error}", ERROR)
        parsed, problem = parse_arguments(self.name, parameters, arguments)
        if problem is not None:
            return ToolResult(problem, BAD_ARGUMENTS)
        try:
            result = self.tool(parsed)
        except Exception as error:  # noqa: BLE001 - a tool never raises to the rollout
            return ToolResult(cut(f"{self.name} failed: {type(error).__name__}: {error}", 2000),
                              ERROR)
        if isinstance(result, ToolResult):
            return result
        if isinstance(result, str):
            return ToolResult(cut(result))
        return ToolResult(f"{self.name} returned {type(result).__name__}, not a ToolResult",
                          ERROR)


__all__ = ["ENTRY_POINT_GROUP", "TOOLS", "GuardedTool", "ToolFactory", "UnknownToolError",
           "check_tool", "get_tool", "tool_names"]
