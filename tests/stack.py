"""The real services of the end-to-end tests (a pytest plugin loaded by tests/conftest.py): a Ray
head (`ray start`), an MLflow server, a Celery worker process on the test database, and helpers
to submit tiny runs and wait for their states. Each service starts only when a test asks for it."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import warnings
from contextlib import closing
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]
# Built models (tiny:nano, the warm start tiny:small-addition: an SFT of about a minute) are
# cached where `make run` caches them, once per machine: each build's folder is named by a
# digest of its recipe, so a changed model or recipe is built afresh, never reused stale. Read
# as the tests start (the training tier's `tiny_cache` points the variable elsewhere later), so
# both tiers' runs of the warm start share one build: the first builds it under a file lock, the
# other waits for it.
MACHINE_CACHE = os.environ.get("ASCENT_CACHE_DIR") or str(ROOT / "var" / "cache")
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


# --- the dispatch worker ----------------------------------------------------------------------

def tiny_run(steps: int, **trainer) -> dict:
    return {
        "algorithm": "grpo", "seed": 3, "model": {"path": "tiny:nano"},
        "data": {"synthetic": {"task": "addition", "digits": 1, "num_train": 32, "num_val": 0},
                 "prompt_template": "plain", "train_batch_size": 4},
        "rollout": {"n_samples_per_prompt": 4, "max_new_tokens": 4},
        "actor": {"lr": 1e-3, "ppo_mini_batch_size": 4, "ppo_micro_batch_size": 16},
        "reward": {"functions": [{"name": "exact_match"}]},
        "trainer": {"total_steps": steps, "save_every": 2, **trainer},
    }


class CeleryWorker:
    """`celery -A ascent worker --beat` as a separate process on the test database."""

    def __init__(self, env: dict[str, str], folder: Path):
        self.env, self.folder, self.proc = env, folder, None
        self.count = 0

    def start(self) -> None:
        self.count += 1
        log = open(self.folder / f"worker-{self.count}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "ascent", "worker", "--beat", "--pool=solo",
             "--loglevel=INFO", "-s", str(self.folder / f"beat-{self.count}"), "--without-gossip",
             "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return "".join(p.read_text() for p in sorted(self.folder.glob("worker-*.log")))


@pytest.fixture
def dispatch_env(ray_head, ray_head_token, mlflow_server, tmp_path, settings):
    """Settings of this process and the worker's environment: the same database, broker,
    MLflow server, Ray token and runs folder."""
    db = connection.settings_dict
    database_url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    runs = tmp_path / "runs"
    cache = MACHINE_CACHE  # built models, once per machine
    settings.MLFLOW_TRACKING_URI = mlflow_server
    settings.RAY_AUTH_TOKEN = ray_head_token
    settings.ASCENT_RUNS_DIR = runs
    env = {**os.environ, "DATABASE_URL": database_url, "MLFLOW_TRACKING_URI": mlflow_server,
           "RAY_AUTH_TOKEN": ray_head_token, "ASCENT_RUNS_DIR": str(runs),
           "ASCENT_CACHE_DIR": cache, "ASCENT_JOB_PYTHON": sys.executable,
           "ASCENT_SCHEDULE_EVERY_S": "1", "ASCENT_WATCH_EVERY_S": "1",
           "ASCENT_RECONCILE_EVERY_S": "3", "ASCENT_PROBE_EVERY_S": "1",
           "PYTHONPATH": f"{ROOT / 'platform'}{os.pathsep}{ROOT}"}
    env.pop("RAY_ADDRESS", None)
    # Tasks an earlier test queued are dropped, here on the broker the worker reads (a `celery
    # purge` process would spend seconds starting Django to do the same).
    from ascent.celery import app

    app.control.purge()
    return env


@pytest.fixture
def worker(dispatch_env, tmp_path):
    worker = CeleryWorker(dispatch_env, tmp_path)
    worker.start()
    yield worker
    worker.stop()
    Path(tmp_path / "worker.log").write_text(worker.log())


def wait_state(run_id: int, states: set[str], timeout: float, worker: CeleryWorker | None = None):
    """Poll the database until the run is in one of `states`; the run. On a timeout the error
    shows its events, attempts and the worker's log."""
    from experiments.models import Attempt, Run

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = Run.objects.get(pk=run_id)
        if run.state in states:
            return run
        time.sleep(0.3)
    events = list(Run.objects.get(pk=run_id).events.values_list("to_state", "message"))
    tail = worker.log()[-4000:] if worker else ""
    attempts = list(Attempt.objects.filter(run_id=run_id).values("number", "exit_code",
                                                                 "exit_message"))
    raise AssertionError(f"run {run_id} is {run.state}, not {states}, after {timeout} s; "
                         f"events {events}; attempts {attempts}\nworker log:\n{tail}")


class WebhookReceiver:
    """A webhook's receiver: an HTTP server on 127.0.0.1 that records each request and answers the statuses given,
    then 200."""

    def __init__(self, statuses=()):
        self.requests: list[dict] = []
        self.statuses = list(statuses)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append({"headers": dict(self.headers), "body": body})
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"no" if status >= 300 else b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
