"""The tool registry, the calculator's exact arithmetic and refusals, the python tool, and
tools of installed packages found by entry point."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from rl_core.errors import InputError
from rl_core.tools import (
    TOOLS,
    PythonTool,
    SandboxLimits,
    ToolResult,
    UnknownToolError,
    check_tool,
    evaluate,
    get_tool,
    tool_names,
)

FAST = SandboxLimits(cpu_time_s=2, wall_time_s=3)


# --------------------------------------------------------------------------- registry


def test_the_built_ins_are_registered_with_openai_schemas():
    assert {"python", "calculator"} <= set(tool_names()) and set(TOOLS) <= set(tool_names())
    for name in ("python", "calculator"):
        schema = get_tool(name).schema()
        assert schema["type"] == "function"
        function = schema["function"]
        assert function["name"] == name and function["description"]
        assert function["parameters"]["type"] == "object"
        assert function["parameters"]["required"] == list(function["parameters"]["properties"])


def test_an_unknown_tool_names_the_valid_ones():
    with pytest.raises(UnknownToolError, match="unknown tool 'search'.*calculator, python"):
        get_tool("search")
    with pytest.raises(InputError):
        check_tool("search", {})
    with pytest.raises(KeyError):
        check_tool("search", {})


def test_unknown_factory_keyword_arguments_name_the_tool():
    with pytest.raises(TypeError, match="tool 'calculator' does not take \\['precision'\\]"):
        check_tool("calculator", {"precision": 3})
    with pytest.raises(TypeError, match="kwargs must be a mapping"):
        check_tool("python", ["x"])
    check_tool("python", None)
    check_tool("calculator", {})


def test_the_package_imports_without_torch():
    code = "import sys, rl_core.tools; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- calculator


@pytest.mark.parametrize("expression, expected", [
    ("1234*5678", "7006652"),
    ("2**200", str(2**200)),
    ("123456789123456789 * 987654321987654321", str(123456789123456789 * 987654321987654321)),
    ("0.1 + 0.2", "0.3"),
    ("1/8", "0.125"),
    ("-7/4", "-1.75"),
    ("6/3", "2"),
    ("1/3", "0.3333333333333333"),
    ("2/3", "0.6666666666666666"),
    ("7 // 2", "3"),
    ("-7 % 3", "2"),
    ("(1 + 2) * 3.5", "10.5"),
    ("2**-2", "0.25"),
    ("-(3 - 5) ** 2", "-4"),
    ("2**0.5", "1.4142135623730951"),
    ("1_000 * 3", "3000"),
    ("1e3 / 8", "125"),
])
def test_the_calculator_is_exact(expression, expected):
    assert evaluate(expression) == expected
    assert get_tool("calculator")({"expression": expression}) == ToolResult(expected, "ok")


@pytest.mark.parametrize("expression, status, says", [
    ("1/0", "error", "division by zero"),
    ("5 % 0", "error", "division by zero"),
    ("0 ** -1", "error", "division by zero"),
    ("10 ** 100000", "error", "too large"),
    ("(2**10000) * (2**10000)", "error", "too large"),
    ("(-8) ** 0.5", "error", "not a real number"),
    ("x + 1", "bad_arguments", "'x' is not allowed"),
    ("__import__('os').system('true')", "bad_arguments", "is not allowed"),
    ("(1).__class__", "bad_arguments", "is not allowed"),
    ("'a' * 3", "bad_arguments", "only numbers"),
    ("True + 1", "bad_arguments", "only numbers"),
    ("1 +", "bad_arguments", "not an arithmetic expression"),
    ("", "bad_arguments", "give an arithmetic expression"),
    ("1" * 2000, "bad_arguments", "more than the limit"),
    ("(" * 300 + "1" + ")" * 300, "bad_arguments", ""),
])
def test_the_calculator_refuses_with_a_reason(expression, status, says):
    result = get_tool("calculator")({"expression": expression})
    assert result.status == status and says in result.text, result
    assert result.text.startswith("calculator: ")


# --------------------------------------------------------------------------- arguments


def test_bad_arguments_name_the_problem():
    calculator = get_tool("calculator")
    result = calculator({"expr": "1+1"})
    assert result.status == "bad_arguments"
    assert "unknown argument(s) expr" in result.text
    assert "missing required argument(s) expression" in result.text
    assert calculator({"expression": 12}).status == "bad_arguments"
    assert "must be a JSON string" in calculator({"expression": 12}).text
    assert calculator("not json").status == "bad_arguments"
    assert calculator(["1+1"]).status == "bad_arguments"
    assert calculator('{"expression": "2+2"}') == ToolResult("4", "ok")


# --------------------------------------------------------------------------- python


def test_the_python_tool_answers_stdout():
    python = get_tool("python", limits=FAST)
    assert python({"code": "print(6 * 7)"}) == ToolResult("42\n", "ok")
    assert python({"code": "x = 1"}).text == "(the program printed nothing)"


def test_the_python_tool_answers_the_errors_last_lines():
    python = get_tool("python", limits=FAST)
    result = python({"code": "print('before')\n[][1]"})
    assert result.status == "error"
    assert result.text.startswith("before\n")
    assert result.text.endswith("IndexError: list index out of range")


@pytest.mark.parametrize("code, status, says", [
    ("import time\ntime.sleep(60)", "timeout", "timed out after 1 s"),
    ("import socket\nsocket.socket()", "refused", "not allowed"),
    ("while True:\n    print('x' * 80)", "output", "more than"),
    ("x = bytearray(4 * 1024**3)", "memory", "out of memory"),
])
def test_the_python_tool_reports_each_failure(code, status, says):
    python = get_tool("python", limits=SandboxLimits(cpu_time_s=1, wall_time_s=1))
    result = python({"code": code})
    assert result.status == status and says in result.text, result


def test_the_python_tool_refuses_missing_code():
    result = get_tool("python")({})
    assert result.status == "bad_arguments" and "code" in result.text


# --------------------------------------------------------------------------- entry points

PLUGIN = '''
from rl_core.tools import ToolResult

class Echo:
    name = "echo"

    def __init__(self, limits, prefix=""):
        self.limits, self.prefix = limits, prefix

    def schema(self):
        return {"type": "function", "function": {
            "name": "echo", "description": "Repeat a text.",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                           "required": ["text"]}}}

    def __call__(self, arguments):
        if arguments["text"] == "boom":
            raise RuntimeError("exploded")
        return ToolResult(self.prefix + arguments["text"], "ok")

class Clash(Echo):
    name = "python"
'''


@pytest.fixture
def installed_plugin(tmp_path, monkeypatch):
    """A package on sys.path with a dist-info declaring `ascent.tools` entry points."""
    (tmp_path / "ascent_echo_tools.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "ascent_echo_tools-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ascent-echo-tools\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[ascent.tools]\necho = ascent_echo_tools:Echo\npython = ascent_echo_tools:Clash\n"
        "broken = ascent_echo_tools:Missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("ascent_echo_tools", None)


def test_an_entry_point_tool_is_found_built_and_guarded(installed_plugin):
    assert {"echo", "broken"} <= set(tool_names())
    check_tool("echo", {"prefix": "> "})
    with pytest.raises(TypeError, match="tool 'echo' does not take \\['loud'\\].*prefix"):
        check_tool("echo", {"loud": True})
    echo = get_tool("echo", {"prefix": "> "}, limits=FAST)
    assert echo.schema()["function"]["name"] == "echo"
    assert echo({"text": "hi"}) == ToolResult("> hi", "ok")
    assert echo({"txt": "hi"}).status == "bad_arguments"
    failed = echo({"text": "boom"})
    assert failed.status == "error" and "RuntimeError: exploded" in failed.text


def test_a_built_in_name_wins_over_an_entry_point(installed_plugin, caplog):
    with caplog.at_level(logging.WARNING, logger="rl_core.tools.registry"):
        assert tool_names().count("python") == 1
    tool = get_tool("python", limits=FAST)
    assert isinstance(tool, PythonTool)
    assert tool({"code": "print(1)"}) == ToolResult("1\n", "ok")
    assert "has the name of a built-in tool" in caplog.text


def test_an_entry_point_that_cannot_load_is_an_input_error(installed_plugin):
    with pytest.raises(InputError, match="tool 'broken'.*cannot be loaded"):
        get_tool("broken")
