#!/usr/bin/env python3
"""Run the test suite as three tiers side by side, or one pytest when arguments narrow it.

    python scripts/test_tiers.py                 # the whole suite: three tiers at once
    python scripts/test_tiers.py tests/unit -x   # a plain pytest with these arguments

The two training tiers (tests/training, tests/ray: rl_core in-process and on a local Ray,
compute-bound; `ray` holds the multi-process tests, whose time is mostly process start-up and
collective waits, `training` the rest) and the service tier (everything else: PostgreSQL,
Redis, a Celery worker, a Ray head started by `ray start`, MLflow, Chromium, mostly waiting on
I/O) share no fixture and no state, so they run as pytest processes at once; the suite takes
about as long as the longest tier instead of all. The training tiers run without REDIS_URL:
their tests use no Redis, and they must not clear the service tier's rate-limit keys. Each tier
writes its report to a log beside the suite and the reports are printed when all have ended,
with a progress line per tier every minute meanwhile. The exit status is the first non-zero
tier status, 0 when all pass.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINING = ["tests/training", "tests/ray"]
# The multi-process part of TRAINING: Ray actors, torch.distributed process groups, vLLM.
RAY = ["tests/ray", "tests/training/test_determinism.py", "tests/training/test_distributed.py",
       "tests/training/test_vllm.py", "tests/training/test_partial_rollout.py"]
PROGRESS_EVERY_S = 60


def pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


def last_line(log: Path) -> str:
    """The tier's latest progress (the tail of pytest's dotted line or its last line)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][-80:] if lines else "starting"


def main(argv: list[str]) -> int:
    if argv:
        return subprocess.call(pytest(*argv), cwd=ROOT)
    logs = Path(tempfile.mkdtemp(prefix="ascent-tests-"))
    training_env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    tiers = {
        "training": (pytest("-q", *TRAINING, *(f"--ignore={path}" for path in RAY)),
                     training_env),
        "ray": (pytest("-q", *RAY), training_env),
        "service": (pytest("-q", *(f"--ignore={path}" for path in TRAINING)), dict(os.environ)),
    }
    started = time.monotonic()
    running = {}
    for name, (command, env) in tiers.items():
        log = logs / f"{name}.log"
        with log.open("w") as out:
            running[name] = (subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                              stderr=subprocess.STDOUT), log)
    print(f"[tests] {len(tiers)} tiers at once, reports in {logs}: "
          + "; ".join(f"{n}: {' '.join(tiers[n][0][3:])}" for n in tiers), flush=True)
    status: dict[str, int] = {}
    report_at = started + PROGRESS_EVERY_S
    try:
        while len(status) < len(running):
            time.sleep(1)
            for name, (proc, _) in running.items():
                if name not in status and proc.poll() is not None:
                    status[name] = proc.returncode
                    minutes = (time.monotonic() - started) / 60
                    print(f"[tests] {name} tier ended with status {proc.returncode} after "
                          f"{minutes:.1f} min", flush=True)
            if time.monotonic() >= report_at and len(status) < len(running):
                report_at += PROGRESS_EVERY_S
                print("[tests] " + " | ".join(f"{n}: {last_line(log)}" for n, (_, log)
                                              in running.items() if n not in status), flush=True)
    except KeyboardInterrupt:
        for proc, _ in running.values():
            proc.terminate()
        raise
    for name, (_, log) in running.items():
        print(f"\n{'=' * 30} {name} tier ({' '.join(tiers[name][0][3:])}) {'=' * 30}", flush=True)
        sys.stdout.write(log.read_text(errors="replace"))
    failed = [s for s in status.values() if s != 0]
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
