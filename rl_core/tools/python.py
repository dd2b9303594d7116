"""The `python` tool: runs the model's code in the sandbox and answers what it printed.

    tool = PythonTool(SandboxLimits(wall_time_s=5))
    tool({"code": "print(6*7)"})                 # ToolResult(text="42\\n", status="ok")
    tool({"code": "while True: pass"}).text     # "... timed out after 5 s ..."

The text is the program's stdout; when the program failed, followed by the last lines of its
stderr (the error), which end with the sandbox's note of why it was stopped, if it was.
"""

from __future__ import annotations

from rl_core.tools.base import OK, FunctionTool, ToolResult, cut
from rl_core.tools.sandbox import SandboxLimits, run_python

ERROR_LINES = 20  # of stderr shown after a failure


class PythonTool(FunctionTool):
    """The `python` tool (see the module's docstring); `limits` bound every run."""

    name = "python"
    description = ("Run a Python program in a sandbox (no network, no files outside its own "
                   "folder, limited time and memory) and read what it printed. State is not "
                   "kept between calls: print what you need.")
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string",
                                "description": "The whole program; its stdout is the answer."}},
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()

    def run(self, code: str) -> ToolResult:
        result = run_python(code, self.limits)
        if result.status == OK:
            text = result.stdout or "(the program printed nothing)"
            return ToolResult(cut(text), OK)
        lines = result.stderr.rstrip("\n").splitlines()[-ERROR_LINES:]
        text = result.stdout + ("\n" if result.stdout and not result.stdout.endswith("\n")
                                else "")
        text += "\n".join(lines) if lines else f"exit status {result.exit_code}"
        return ToolResult(cut(text), result.status)


__all__ = ["PythonTool"]
