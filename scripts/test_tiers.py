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
Each tier's ten slowest tests follow its report, and one closing line sums both tiers'
counts (`suite: N passed, N failed, N skipped`, with errors counted as failures).
Each tier computes on half the CPUs' threads (`tier_threads`). The exit status is the first
non-zero tier status, 0 when both pass.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINING = ["tests/training", "tests/ray"]
PROGRESS_EVERY_S = 60
SLOWEST = 10
# pytest's closing line, e.g. "== 2703 passed, 2 skipped, 3 warnings in 1218.32s (0:20:18) =="
SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+(?:, )?)+) in [\d.]+s")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")
# one line of pytest's --durations report: "12.34s call     tests/x.py::test_y"
DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S.*)$")


def pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *args]


def last_line(log: Path) -> str:
    """The tier's latest progress (the tail of pytest's dotted line or its last line)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][-80:] if lines else "starting"


def counts(report: str) -> dict[str, int]:
    """The outcome counts of a pytest report's closing line ({} when it has none)."""
    for line in reversed(report.splitlines()):
        found = SUMMARY.match(line.strip())
        if found:
            return {("errors" if kind.startswith("error") else kind): int(n)
                    for n, kind in COUNT.findall(found.group(1))}
    return {}


def slowest(report: str, n: int = SLOWEST) -> list[str]:
    """The n slowest tests of a report's --durations section, setup, call and teardown added."""
    total: dict[str, float] = {}
    for line in report.splitlines():
        found = DURATION.match(line.strip())
        if found:
            total[found.group(3)] = total.get(found.group(3), 0.0) + float(found.group(1))
    ranked = sorted(total.items(), key=lambda item: -item[1])[:n]
    return [f"{seconds:8.1f} s  {test}" for test, seconds in ranked]


def closing_line(reports: dict[str, str]) -> str:
    """One line with both tiers' counts, in the plain form CI reads ("N passed, N failed")."""
    tiers = {name: counts(report) for name, report in reports.items()}
    total = {kind: sum(c.get(kind, 0) for c in tiers.values())
             for kind in ("passed", "failed", "errors", "skipped")}
    def said(kind: str, n: int) -> str:
        return f"{n} {'error' if kind == 'errors' and n == 1 else kind}"

    detail = "; ".join(f"{name} " + (", ".join(said(k, v) for k, v in c.items()) or "no summary")
                       for name, c in tiers.items())
    failed = total["failed"] + total["errors"] + sum(1 for c in tiers.values() if not c)
    return (f"[tests] {detail}\n"
            f"suite: {total['passed']} passed, {failed} failed, {total['skipped']} skipped")


def tier_threads(environ: Mapping[str, str]) -> dict[str, str]:
    """OMP_NUM_THREADS for each of the two tiers: half the CPUs (at least one), unless set.

    torch computes on a thread per CPU by default, and its OpenMP threads spin while they wait
    for each other: two tiers doing so side by side on 2 cores keep preempting each other's
    spinning threads, and an in-process training test took 57 s instead of 4 (measured beside
    a busy core: 13.4 s on 2 threads, 3.7 s on 1)."""
    if environ.get("OMP_NUM_THREADS"):
        return {}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // 2))}


def main(argv: list[str]) -> int:
    if argv:
        return subprocess.call(pytest(*argv), cwd=ROOT)
    logs = Path(tempfile.mkdtemp(prefix="ascent-tests-"))
    common = {**os.environ, **tier_threads(os.environ)}
    training_env = {k: v for k, v in common.items() if k != "REDIS_URL"}
    tiers = {
        "training": (pytest("-q", "--durations=40", *TRAINING), training_env),
        "service": (pytest("-q", "--durations=40", *(f"--ignore={path}" for path in TRAINING)),
                    common),
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
    reports = {name: log.read_text(errors="replace") for name, (_, log) in running.items()}
    for name, report in reports.items():
        print(f"\n{'=' * 30} {name} tier ({' '.join(tiers[name][0][3:])}) {'=' * 30}", flush=True)
        sys.stdout.write(report)
    minutes = (time.monotonic() - started) / 60
    for name, report in reports.items():
        print(f"\n[tests] the {name} tier's {SLOWEST} slowest tests (setup + call + teardown):")
        print("\n".join(slowest(report)) or "  (no durations in its report)")
    print(f"\n[tests] both tiers took {minutes:.1f} min")
    print(closing_line(reports), flush=True)
    failed = [s for s in status.values() if s != 0]
    return failed[0] if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
