"""The platform as `make run` serves it on a fresh machine, for tests that need a live server.

The server uses the embedded defaults (its own SQLite file under a temporary ASCENT_VAR_DIR, no
DATABASE_URL or REDIS_URL), so these tests use no test database.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def embedded_env(var_dir: Path) -> dict[str, str]:
    """The environment of `make run` on a fresh machine, with its own var/ folder."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(ASCENT_VAR_DIR=str(var_dir), DJANGO_SETTINGS_MODULE="ascent.settings",
               PYTHONUNBUFFERED="1")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"manage.py {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


@contextmanager
def runserver(env: dict[str, str], log_path: Path) -> Iterator[str]:
    """`manage.py runserver` on a free port until /healthz answers; yields the base URL, stops
    it on exit."""
    def command(port: int) -> list[str]:
        return [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]

    with serve(command, env, log_path) as base:
        yield base


# What a server prints when its port was taken between choosing it and binding it.
PORT_TAKEN = ("That port is already in use", "Address already in use", "Connection in use")


@contextmanager
def serve(command_for: Callable[[int], list[str]], env: dict[str, str], log_path: Path,
          tries: int = 3) -> Iterator[str]:
    """A web server process (its own process group), `command_for(port)` on a free port, until
    /healthz answers; yields the base URL and stops the whole group on exit. The tests start
    many servers at once, so a port can be taken between choosing it and binding it: the server
    then starts again on another, up to `tries` times."""
    for _ in range(tries):
        port = free_port()
        with log_path.open("w") as log:
            server = subprocess.Popen(command_for(port), cwd=ROOT, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}"
        try:
            if _started(server, base, log_path):
                yield base
                return
        finally:
            _stop(server)
    raise AssertionError(f"no free port in {tries} tries:\n{log_path.read_text()}")


def _started(server: subprocess.Popen, base: str, log_path: Path) -> bool:
    """Whether the server answers /healthz (False: it could not bind its port)."""
    deadline = time.monotonic() + 60
    while True:
        if server.poll() is not None:  # first: a server of someone else's may hold the port
            text = log_path.read_text()
            if any(words in text for words in PORT_TAKEN):
                return False
            raise AssertionError(f"the server exited:\n{text}")
        if _healthy(base):
            return True
        assert time.monotonic() < deadline, f"/healthz silent for 60 s:\n{log_path.read_text()}"
        time.sleep(0.2)


def _stop(server: subprocess.Popen) -> None:
    """The server's whole process group, politely, then not."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(server.pid, sig)
        except ProcessLookupError:  # the group has ended
            server.wait()
            return
        try:
            server.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=2) as answer:
            return json.load(answer) == {"status": "ok"}
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
