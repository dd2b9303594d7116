"""Tools a model calls during a rollout, and the sandbox that runs model-written code.

    from rl_core.tools import get_tool, run_python

    tool = get_tool("calculator")
    tool.schema()                              # the OpenAI function schema shown to the model
    tool({"expression": "1234*5678"})          # ToolResult(text="7006652", status="ok")
    get_tool("python", limits=SandboxLimits(wall_time_s=5))({"code": "print(2**10)"})
    run_python("print(input()[::-1])", stdin="abc").stdout   # "cba\\n"

Importing this package needs neither torch nor any other heavy package.
"""

from rl_core.tools.base import FunctionTool, Tool, ToolResult, function_schema
from rl_core.tools.calculator import Calculator, evaluate
from rl_core.tools.python import PythonTool
from rl_core.tools.registry import (
    ENTRY_POINT_GROUP,
    TOOLS,
    UnknownToolError,
    check_tool,
    get_tool,
    tool_names,
)
from rl_core.tools.sandbox import SandboxLimits, SandboxResult, run_python

__all__ = [
    "ENTRY_POINT_GROUP",
    "TOOLS",
    "Calculator",
    "FunctionTool",
    "PythonTool",
    "SandboxLimits",
    "SandboxResult",
    "Tool",
    "ToolResult",
    "UnknownToolError",
    "check_tool",
    "evaluate",
    "function_schema",
    "get_tool",
    "run_python",
    "tool_names",
]
