"""scripts/test_tiers.py's report: each tier's counts from pytest's closing line, its slowest
tests from --durations, and one closing line that sums both tiers in the form CI reads."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test_tiers.py"
spec = importlib.util.spec_from_file_location("test_tiers", SCRIPT)
tiers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tiers)

TRAINING = """\
....s..F                                                                 [100%]
============================= slowest 40 durations =============================
12.30s call     tests/training/test_a.py::test_slow
1.00s setup    tests/training/test_a.py::test_slow
3.00s call     tests/training/test_b.py::test_middle[2-ppo]
0.50s teardown tests/training/test_b.py::test_fast
=========================== short test summary info ============================
FAILED tests/training/test_b.py::test_broken - AssertionError
1 failed, 97 passed, 7 skipped, 28 warnings in 1275.47s (0:21:15)
"""
SERVICE = "2703 passed, 2 skipped, 1 error in 1140.13s (0:19:00)\n"


def test_counts_come_from_the_closing_line_errors_as_their_own_kind():
    assert tiers.counts(TRAINING) == {"failed": 1, "passed": 97, "skipped": 7}
    assert tiers.counts(SERVICE) == {"passed": 2703, "skipped": 2, "errors": 1}
    assert tiers.counts("Traceback (most recent call last):\nKeyboardInterrupt\n") == {}


def test_the_slowest_tests_add_setup_call_and_teardown():
    assert tiers.slowest(TRAINING, 2) == ["    13.3 s  tests/training/test_a.py::test_slow",
                                          "     3.0 s  tests/training/test_b.py::test_middle[2-ppo]"]
    assert tiers.slowest(SERVICE) == []


def test_the_closing_line_sums_both_tiers_and_counts_a_tier_without_summary_as_failed():
    detail, last = tiers.closing_line({"training": TRAINING, "service": SERVICE}).splitlines()
    assert detail == ("[tests] training 1 failed, 97 passed, 7 skipped; "
                      "service 2703 passed, 2 skipped, 1 error")
    assert last == "suite: 2800 passed, 2 failed, 9 skipped"
    _, last = tiers.closing_line({"training": "killed\n", "service": SERVICE}).splitlines()
    assert last == "suite: 2703 passed, 2 failed, 2 skipped"


def test_each_tier_computes_on_half_the_cpus_unless_told(monkeypatch):
    for cpus, threads in ((2, "1"), (1, "1"), (8, "4"), (None, "1")):
        monkeypatch.setattr(tiers.os, "cpu_count", lambda cpus=cpus: cpus)
        assert tiers.tier_threads({}) == {"OMP_NUM_THREADS": threads}, cpus
    assert tiers.tier_threads({"OMP_NUM_THREADS": "3"}) == {}  # a setting of one's own stays
