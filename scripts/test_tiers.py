#!/usr/bin/env python3
"""Run the test suite as two tiers side by side, or one pytest when arguments narrow it.

    python scripts/test_tiers.py                 # the whole suite: two tiers at once
    python scripts/test_tiers.py tests/unit -x   # a plain pytest with these arguments

The training tier (tests/training, tests/ray: rl_core on a local Ray, compute-bound) and the
service tier (everything else: PostgreSQL, Redis, a Celery worker, a Ray head started by
`ray start`, MLflow, Chromium, mostly waiting on I/O) share no fixture and no state, so they
run as two pytest processes at once; the suite takes about as long as the longer tier instead
of both (a third process, splitting the training tier, was slower on 2 cores: its tests are
compute-bound and contend for the same cores). The training tier runs without REDIS_URL: its tests use no Redis, and it must not clear
the service tier's rate-limit keys. Each tier writes its report to a log beside the suite and
the two are printed when both have ended, with a progress line per tier every minute meanwhile.
The exit status is the first non-zero tier status, 0 when both pass.
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
        "training": (pytest("-q", *TRAINING), training_env),
        "service": (pytest("-q", *(f"--ignore={path}" for path in TRAINING)), dict(os.environ)),
    }
    started = time.monotonic()
    running = {}
    for name, (command, env) in tiers.items():
        log = logs / f"{name}.log"
        with log.open("w") as out:
            running[name] = (subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                              stderr=subprocess.STDOUT), log)
    print(f"[tests] two tiers at once, reports in {logs}: "
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
