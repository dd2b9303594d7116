"""The sandbox runs real Python processes: normal programs, and each kind of misbehaviour ends
with its status, a readable reason, nothing left running and nothing written outside."""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from rl_core.errors import InputError
from rl_core.tools.sandbox import SandboxLimits, run_python

FAST = SandboxLimits(cpu_time_s=2, memory_mb=256, wall_time_s=3, output_bytes=2048)


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(autouse=True)
def no_process_left():
    before = _children()
    yield
    left = _children() - before
    assert not left, f"processes left behind: {left}"


def test_a_normal_program_gives_its_output_and_exit_code():
    result = run_python("import sys\nprint('hello')\nprint('warn', file=sys.stderr)", FAST)
    assert (result.status, result.stdout, result.stderr, result.exit_code) == (
        "ok", "hello\n", "warn\n", 0)
    assert result.ok and result.seconds > 0


def test_stdin_is_the_programs_input():
    code = "n = int(input())\nprint(sum(int(x) for x in input().split()) * n)"
    assert run_python(code, FAST, stdin="2\n1 2 3\n").stdout == "12\n"


def test_a_non_zero_exit_and_an_exception_are_errors_with_the_traceback():
    assert run_python("raise SystemExit(3)", FAST).exit_code == 3
    result = run_python("def f():\n    return 1 / 0\nf()", FAST)
    assert (result.status, result.exit_code) == ("error", 1)
    assert 'File "main.py", line 2, in f' in result.stderr
    assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "_bootstrap" not in result.stderr and "<string>" not in result.stderr


def test_a_syntax_error_is_an_error():
    result = run_python("def (:", FAST)
    assert result.status == "error" and "SyntaxError" in result.stderr


def test_connecting_to_a_listening_socket_is_refused():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        port = server.getsockname()[1]
        code = ("import socket\n"
                f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                "s.sendall(b'leak')\nprint('connected')")
        result = run_python(code, FAST)
        with pytest.raises(TimeoutError):
            server.accept()
    assert result.status == "refused", result
    assert "connected" not in result.stdout
    assert "PermissionError: sandbox:" in result.stderr and "[sandbox]" in result.stderr


def test_a_raw_socket_is_refused_even_when_the_error_is_caught():
    code = ("import socket\ntry:\n    socket.socket()\nexcept PermissionError as e:\n"
            "    print('caught', e)\n")
    result = run_python(code, FAST)
    assert result.status == "refused" and result.stdout.startswith("caught sandbox:")


def test_writing_outside_the_working_folder_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    for code in (f"open({str(target)!r}, 'w').write('x')",
                 f"import os\nos.open({str(target)!r}, os.O_WRONLY | os.O_CREAT)",
                 f"import pathlib\npathlib.Path({str(target)!r}).write_text('x')",
                 f"open('../{target.name}', 'w')",
                 f"import os\nos.mkdir({str(tmp_path / 'made')!r})",
                 f"import os\nos.symlink({str(target)!r}, 'link')"):
        result = run_python(code, FAST)
        assert result.status == "refused", (code, result)
        assert "is not allowed" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_working_folder_is_writable_and_removed_afterwards():
    code = ("import os, tempfile\nopen('notes.txt', 'w').write('kept')\n"
            "fd, path = tempfile.mkstemp()\nos.close(fd)\nprint(os.getcwd())\n"
            "print(open('notes.txt').read())")
    result = run_python(code, FAST)
    assert result.status == "ok", result
    folder, text = result.stdout.split()
    assert text == "kept" and not os.path.exists(folder)


def test_the_environment_is_cleared():
    os.environ["ASCENT_SANDBOX_SECRET"] = "do-not-show"
    try:
        result = run_python("import os\nprint(sorted(os.environ))", FAST)
    finally:
        del os.environ["ASCENT_SANDBOX_SECRET"]
    assert "ASCENT_SANDBOX_SECRET" not in result.stdout and "PATH" in result.stdout


@pytest.mark.parametrize("code", [
    "import os\nwhile True:\n    os.fork()",
    "import subprocess\nsubprocess.run(['sleep', '100'])",
    "import os\nos.system('sleep 100')",
    "import ctypes\nctypes.CDLL(None).fork()",
    "import sys\ndel sys.modules['_posixsubprocess']\nimport _posixsubprocess",
])
def test_starting_processes_is_refused(code):
    result = run_python(code, FAST)
    assert result.status == "refused", result
    assert "PermissionError: sandbox:" in result.stderr


def test_a_fork_bomb_that_catches_the_refusal_ends_by_its_time_limit():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = run_python(code, SandboxLimits(cpu_time_s=1, wall_time_s=3))
    assert result.status == "timeout", result
    assert "CPU time" in result.stderr or "wall time" in result.stderr


def test_a_memory_bomb_is_stopped_as_memory():
    for code in ("x = bytearray(2 * 1024**3)", "x = []\nwhile True:\n    x.append(' ' * 10**6)"):
        result = run_python(code, FAST)
        assert result.status == "memory", result
        assert "memory" in result.stderr and "256 MiB" in result.stderr


def test_an_endless_loop_is_stopped_by_its_cpu_time():
    result = run_python("while True:\n    pass", SandboxLimits(cpu_time_s=1, wall_time_s=30))
    assert result.status == "timeout", result
    assert "1 s of CPU time" in result.stderr and result.exit_code is None
    assert result.seconds < 25  # stopped by the CPU limit, far before the wall limit


def test_sleeping_is_stopped_by_the_wall_time_and_the_caller_goes_on():
    started = time.monotonic()
    result = run_python("import time\nprint('start', flush=True)\ntime.sleep(600)",
                        SandboxLimits(wall_time_s=1))
    assert result.status == "timeout" and result.stdout == "start\n"
    assert "1 s of wall time" in result.stderr
    assert time.monotonic() - started < 60  # generous: it was stopped, not waited for


def test_an_output_flood_is_cut_and_stopped():
    result = run_python("while True:\n    print('y' * 100)", FAST)
    assert result.status == "output", result
    assert len(result.stdout) == 2048 and set(result.stdout) <= {"y", "\n"}
    assert "more than 2048 bytes" in result.stderr


def test_a_flood_on_stderr_is_cut_too():
    result = run_python("import sys\nwhile True:\n    sys.stderr.write('e' * 100)", FAST)
    assert result.status == "output"
    assert result.stderr.startswith("e" * 2048) and "[sandbox]" in result.stderr


def test_calls_from_many_threads_at_once_are_independent():
    codes = [f"import sys\nprint(int(input()) * {i})\nsys.exit({i % 2})" for i in range(12)]
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda i: run_python(codes[i], FAST, stdin=f"{i}\n"), range(12)))
    for i, result in enumerate(results):
        assert result.stdout == f"{i * i}\n" and result.exit_code == i % 2, result


def test_bad_limits_name_the_field():
    with pytest.raises(InputError, match="memory_mb"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(InputError, match="wall_time_s"):
        SandboxLimits(wall_time_s="ten")
