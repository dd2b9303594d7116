"""Golden runs: seeded 5-step GRPO, PPO and DPO runs on the tiny SFT base (right part of the
time, so rewards differ within groups), in process and on two Ray ranks, whose metrics must stay
what they were when recorded (tests/training/golden/*.json).

A change to rl_core that is meant to keep behaviour (a restructuring, a new engine behind the
same default) must leave these exactly as they are, up to floating-point rounding. A change that
is meant to alter the numbers re-records them on purpose, as does a new kind of machine (the
files name the machine they were recorded on; elsewhere these tests are skipped, and the
machine-independent comparisons of test_fsdp.py and test_distributed.py still run):

    ASCENT_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/training/test_golden.py
"""

from __future__ import annotations

import pytest
from golden_runs import (
    RECORD,
    STEPS,
    comparable,
    golden_spec,
    machine,
    read_golden,
    same_machine,
    write_golden,
)
from test_trainer import read_metrics

from rl_core.recipes import run
from rl_core.spec import resolve_spec


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "dpo"])
@pytest.mark.parametrize("devices", [1, 2])
def test_metrics_equal_the_recorded_run(algorithm, devices, tmp_path, sft_base, request):
    recorded = None if RECORD else read_golden(algorithm, devices)
    if recorded is not None and not same_machine(recorded["machine"]):
        # said before training: a run whose numbers cannot be compared here costs minutes
        pytest.skip(f"recorded on {recorded['machine']}, this is {machine()}: re-record with "
                    "ASCENT_RECORD_GOLDEN=1 on this kind of machine")
    if devices == 1:
        logged = request.getfixturevalue("plain_run")(algorithm)
    else:
        request.getfixturevalue("local_ray")
        out = tmp_path / "run"
        run(resolve_spec(golden_spec(algorithm, sft_base, out, devices)), backend="ray")
        logged = comparable(read_metrics(out))
    if RECORD:
        write_golden(algorithm, devices, logged)
        recorded = read_golden(algorithm, devices)
    want = recorded["metrics"]
    assert [r["step"] for r in logged] == [r["step"] for r in want]
    assert len(want) >= STEPS, "a golden run logs every step"
    for got, expected in zip(logged, want):
        assert sorted(got) == sorted(expected), got["step"]
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-7), got["step"]
