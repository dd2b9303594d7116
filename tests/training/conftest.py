"""Fixtures for training tests: a real MLflow server, tiny models and synthetic data."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import closing
from pathlib import Path

import pytest


def _free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server (SQLite store, served artifacts) on a free local port."""
    root = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    mlflow = shutil.which("mlflow", path=str(Path(sys.executable).parent)) or "mlflow"
    proc = subprocess.Popen(
        [mlflow, "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
         "--artifacts-destination", str(root / "artifacts"), "--serve-artifacts",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=open(root / "server.log", "w"), stderr=subprocess.STDOUT,
        env={**os.environ, "MLFLOW_TRACKING_URI": ""},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError((root / "server.log").read_text()[-2000:]) from None
            time.sleep(0.5)
    else:
        proc.terminate()
        raise RuntimeError("the MLflow server did not answer /health within 120 s")
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """One cache folder for tiny models across the session (ASCENT_CACHE_DIR)."""
    folder = tmp_path_factory.mktemp("ascent-cache")
    previous = os.environ.get("ASCENT_CACHE_DIR")
    os.environ["ASCENT_CACHE_DIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("ASCENT_CACHE_DIR", None)
    else:
        os.environ["ASCENT_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def sft_base(tmp_path_factory, tiny_cache) -> Path:
    """A tiny model fine-tuned to be right only part of the time: the base the RL algorithms
    must improve. A copy of the committed golden base (tests/training/golden_runs.py says why it
    is committed and how it was made), the same weights on every machine."""
    from golden_runs import BASE, BASE_FILES

    folder = tmp_path_factory.mktemp("sft") / "base"
    folder.mkdir()
    for name in BASE_FILES:
        shutil.copy2(BASE / name, folder / name)
    return folder


class GoldenRuns:
    """`runs(algorithm)`: the comparable metrics of the golden test's spec on `devices` ranks (in
    process on one, on the session's Ray on more), each made once per session;
    `runs.folder(algorithm)`: that run's output folder."""

    def __init__(self, base: Path, folders, devices: int):
        self.base, self.folders, self.devices = base, folders, devices
        self.runs: dict[str, tuple[Path, list[dict]]] = {}

    def __call__(self, algorithm: str) -> list[dict]:
        return self._made(algorithm)[1]

    def folder(self, algorithm: str) -> Path:
        return self._made(algorithm)[0]

    def _made(self, algorithm: str) -> tuple[Path, list[dict]]:
        from golden_runs import THREADS, comparable, golden_run_spec, torch_threads
        from test_trainer import read_metrics

        from rl_core.recipes import run
        from rl_core.spec import resolve_spec

        if algorithm not in self.runs:
            out = self.folders.mktemp(f"golden-{algorithm}-{self.devices}") / "run"
            with torch_threads(THREADS):
                run(resolve_spec(golden_run_spec(algorithm, self.base, out, self.devices)),
                    backend="local" if self.devices == 1 else "ray")
            self.runs[algorithm] = out, comparable(read_metrics(out))
        return self.runs[algorithm]


@pytest.fixture(scope="session")
def plain_run(sft_base, tmp_path_factory):
    """`plain_run(algorithm)`: the comparable metrics of the golden spec's run on one rank with
    the plain engine, in process (made once per session and algorithm)."""
    return GoldenRuns(sft_base, tmp_path_factory, 1)


@pytest.fixture(scope="session")
def ray_run(sft_base, tmp_path_factory, local_ray):
    """`ray_run(algorithm)`: the comparable metrics of the golden spec's run on two sharded,
    deterministic Ray ranks (made once per session and algorithm); `ray_run.folder(algorithm)`
    its output folder."""
    return GoldenRuns(sft_base, tmp_path_factory, 2)
