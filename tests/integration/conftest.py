"""Fixtures for the adapter tests: a real Ray head (`ray start`) and a real MLflow server."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

BIN = Path(sys.executable).parent
MLFLOW_TEST_DB = "ascent_mlflow_test"


def _free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _answers(url: str, headers: dict[str, str] | None = None) -> bool:
    try:
        request = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.HTTPError):
        return False


def _wait(check, what: str, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{what} did not come up within {timeout:.0f} s\n{tail}")
        time.sleep(0.3)


@pytest.fixture
def unused_address() -> str:
    """An HTTP address where nothing listens."""
    return f"http://127.0.0.1:{_free_port()}"


# --- a Ray head -----------------------------------------------------------------------------

def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, process group, state) of every process, from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        table[int(entry)] = (int(ppid), int(pgrp), state)
    return table


def _group_and_descendants(pgid: int) -> set[int]:
    """Live processes of the process group and all their descendants (job drivers run in
    sessions of their own, under the head's workers)."""
    table = _processes()
    found = {pid for pid, (_, pgrp, state) in table.items() if pgrp == pgid and state != "Z"}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _, state) in table.items() if ppid in found and state != "Z"}
        grew = not more <= found
        found |= more
    return found


def _stop_group(pgid: int) -> None:
    """Stop a process group and its descendants: TERM, then KILL what is left after 3 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _group_and_descendants(pgid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while _group_and_descendants(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not _group_and_descendants(pgid):
            return


@dataclass
class RayHead:
    """A Ray head started by `ray start` in a process group of its own.

    Its temp dir is short (Unix socket paths are limited to 107 bytes) and holds the head's
    address file, so `ray.init()` elsewhere never joins it. Every port is chosen free: the defaults
    (dashboard agent 52365, client server 10001) clash with other heads on the machine. Stopping it
    stops that group and its descendants only (`ray stop` would stop every Ray on the machine:
    the session's `local_ray`, other people's).
    """

    url: str
    token: str
    temp_dir: str
    starter: subprocess.Popen

    @classmethod
    def launch(cls, token: str) -> RayHead:
        temp_dir = tempfile.mkdtemp(prefix="rayit-", dir="/tmp")
        dashboard_port = _free_port()
        env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
               "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # `python` in entrypoints
        for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
            env.pop(name, None)
        command = [
            str(BIN / "ray"), "start", "--head", f"--port={_free_port()}",
            f"--dashboard-port={dashboard_port}", f"--dashboard-agent-listen-port={_free_port()}",
            f"--ray-client-server-port={_free_port()}", "--num-cpus=2", "--include-dashboard=true",
            "--disable-usage-stats", f"--temp-dir={temp_dir}",
        ]
        with open(Path(temp_dir) / "ray-start.log", "w") as out:
            starter = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        return cls(f"http://127.0.0.1:{dashboard_port}", token, temp_dir, starter)

    def wait_ready(self) -> None:
        log = Path(self.temp_dir) / "ray-start.log"
        if self.starter.wait(timeout=120) != 0:
            raise RuntimeError(f"`ray start` failed:\n{log.read_text()[-3000:]}")
        auth = {"Authorization": f"Bearer {self.token}"}
        _wait(lambda: _answers(f"{self.url}/api/version", auth), "the Ray dashboard", 60, log)

    def stop(self) -> None:
        _stop_group(self.starter.pid)  # the daemons stay in this group after `ray start` exits
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _drop_database(database_url: str) -> None:
    import psycopg

    with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {MLFLOW_TEST_DB} WITH (FORCE)")


def _postgres_store(database_url: str) -> str | None:
    """A fresh database MLFLOW_TEST_DB next to DATABASE_URL's, as an SQLAlchemy URL; None when
    DATABASE_URL is not PostgreSQL or the database cannot be created."""
    parts = urlsplit(database_url)
    if parts.scheme not in ("postgres", "postgresql", "pgsql"):
        return None
    import psycopg

    try:
        _drop_database(database_url)
        with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"CREATE DATABASE {MLFLOW_TEST_DB}")
    except psycopg.Error as exc:
        warnings.warn(f"MLflow runs on SQLite: no PostgreSQL store ({exc})", stacklevel=1)
        return None
    return urlunsplit(("postgresql+psycopg", parts.netloc, f"/{MLFLOW_TEST_DB}", "", ""))


@dataclass
class MlflowServer:
    """An MLflow tracking server serving artifacts from a temp folder.

    Its store: with DATABASE_URL naming PostgreSQL (as `make test` and scripts/testenv.py
    provide), a fresh database `ascent_mlflow_test` on that server, dropped afterwards; otherwise,
    or when that database cannot be created, an SQLite file (the embedded default), which does
    not exercise the production store.
    """

    url: str
    store: str
    root: Path
    proc: subprocess.Popen

    @classmethod
    def launch(cls, root: Path) -> MlflowServer:
        store = _postgres_store(os.environ.get("DATABASE_URL", "")) or f"sqlite:///{root}/mlflow.db"
        port = _free_port()
        with open(root / "server.log", "w") as out:
            proc = subprocess.Popen(
                [str(BIN / "mlflow"), "server", "--backend-store-uri", store,
                 "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts",
                 "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "MLFLOW_TRACKING_URI": ""},
            )
        return cls(f"http://127.0.0.1:{port}", store, root, proc)

    def wait_ready(self) -> None:
        log = self.root / "server.log"

        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the MLflow server exited:\n{log.read_text()[-3000:]}")
            return _answers(f"{self.url}/health")

        _wait(healthy, "the MLflow server", 120, log)

    def stop(self) -> None:
        _stop_group(self.proc.pid)
        self.proc.wait()
        if self.store.startswith("postgresql"):
            _drop_database(os.environ["DATABASE_URL"])


@pytest.fixture(scope="session")
def ray_head_token() -> str:
    """The token the test head enforces (RAY_AUTH_MODE=token)."""
    return secrets.token_hex(32)


@pytest.fixture(scope="session")
def _services(request, tmp_path_factory, ray_head_token):
    """The services this session's tests ask for, launched side by side (each takes tens of
    seconds to start) and stopped at the end."""
    wanted = {name for item in request.session.items for name in item.fixturenames}
    launched: dict[str, RayHead | MlflowServer] = {}
    try:
        if "ray_head" in wanted:
            launched["ray"] = RayHead.launch(ray_head_token)
        if "mlflow_server" in wanted:
            launched["mlflow"] = MlflowServer.launch(tmp_path_factory.mktemp("mlflow"))
        yield launched
    finally:
        for service in launched.values():
            service.stop()


@pytest.fixture(scope="session")
def ray_head(_services, ray_head_token) -> str:
    """A real Ray head with its dashboard (the Jobs API) and 2 CPUs, enforcing `ray_head_token`;
    its dashboard URL `http://127.0.0.1:<port>`."""
    head = _services.get("ray") or _services.setdefault("ray", RayHead.launch(ray_head_token))
    head.wait_ready()
    return head.url


@pytest.fixture(scope="session")
def mlflow_server(_services, tmp_path_factory) -> str:
    """A real MLflow tracking server on a free local port (store: see MlflowServer); its URL."""
    server = _services.get("mlflow") or _services.setdefault(
        "mlflow", MlflowServer.launch(tmp_path_factory.mktemp("mlflow")))
    server.wait_ready()
    return server.url


@pytest.fixture(scope="session")
def mlflow_store(mlflow_server, _services) -> str:
    """The backend store URI of `mlflow_server`: `postgresql+psycopg://.../ascent_mlflow_test`
    when DATABASE_URL names PostgreSQL, else (a fallback that skips the production store)
    `sqlite:///...`."""
    return _services["mlflow"].store
