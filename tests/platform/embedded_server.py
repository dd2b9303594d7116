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
from collections.abc import Iterator
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
def runserver(env: dict[str, str], port: int, log_path: Path) -> Iterator[str]:
    """`manage.py runserver` until /healthz answers; yields the base URL, stops it on exit."""
    command = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
    with serve(command, env, port, log_path) as base:
        yield base


@contextmanager
def serve(command: list[str], env: dict[str, str], port: int, log_path: Path) -> Iterator[str]:
    """A web server process (its own process group) until /healthz answers on `port`; yields the
    base URL and stops the whole group on exit."""
    with log_path.open("w") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _healthy(base):
            assert server.poll() is None, f"the server exited:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"/healthz silent for 60 s:\n{log_path.read_text()}"
            time.sleep(0.2)
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/healthz", timeout=2) as answer:
            return json.load(answer) == {"status": "ok"}
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False
