"""Golden runs: seeded 5-step GRPO, PPO and DPO runs on the committed SFT base (right part of the
time, so rewards differ within groups), in process with the plain engine and sharded (FSDP2) on
two deterministic Ray ranks, whose metrics must stay what they were when recorded
(tests/training/golden/*.json).

A change to rl_core that is meant to keep behaviour (a restructuring, a new engine behind the
same default) must leave these as they are: equal on a recorded kind of machine, within the
measured cross-kind tolerance elsewhere (golden_runs.py says why these hold on any machine). A
change that is meant to alter the numbers re-records them on purpose, on every kind at hand:

    .venv/bin/python tests/training/golden_runs.py record
"""

from __future__ import annotations

import pytest
from golden_runs import (
    RECORD,
    STEPS,
    assert_close,
    differences,
    machine,
    read_golden,
    same_machine,
    tolerances,
    write_golden,
)

# On the machine kind of a recording: the same numbers (the runs are bitwise reproducible there;
# this only absorbs the last digit of a decimal round trip).
SAME_MACHINE_REL = 1e-12


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "dpo"])
@pytest.mark.parametrize("devices", [1, 2])
def test_metrics_equal_the_recorded_run(algorithm, devices, request):
    golden = read_golden(algorithm, devices)
    assert RECORD or golden["recordings"], (
        f"no recording of {algorithm} on {devices} rank(s): record with golden_runs.py record")
    logged = request.getfixturevalue("plain_run" if devices == 1 else "ray_run")(algorithm)
    if RECORD:
        write_golden(algorithm, devices, logged)
        golden = read_golden(algorithm, devices)
    assert len(logged) >= STEPS, "a golden run logs every step"
    assert any(r.get("actor/grad_norm", 0) > 0 for r in logged), "the run must really update"
    mine = [r for r in golden["recordings"] if same_machine(r["machine"])]
    if mine:
        (want,) = mine
        allowed = {name: SAME_MACHINE_REL * max(abs(row.get(name, 0.0)) for row in want["metrics"])
                   for name in golden["tolerance"]}
        problems = differences(logged, want["metrics"], allowed)
        assert not problems, f"on the recorded {machine()}:\n" + "\n".join(problems)
        return
    allowed = {name: t["abs"] for name, t in golden["tolerance"].items()}
    for recording in golden["recordings"]:  # within the measured spread of every recorded kind
        problems = differences(logged, recording["metrics"], allowed)
        assert not problems, (f"{machine()} against the recording of {recording['machine']}:\n"
                              + "\n".join(problems))


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "dpo"])
def test_two_sharded_ray_ranks_equal_the_plain_engine_on_one_rank(algorithm, plain_run, ray_run):
    """Data parallelism and sharding (FSDP2 on two Ray ranks) change no number but the rounding
    of sums split over two ranks (and so, with each algorithm learning on one rank, each learns
    on two). PPO's gets 1e-3: its critic (lr 1e-3) and actor step on each other's outputs, and
    AdamW, which moves each weight by about lr whatever its gradient's size, turns the rounding
    of one step into differences the next steps carry on (on an AMD EPYC with AVX2 kernels the
    critic's values drifted to 5e-4 and its predictions to 7e-4 by step 5, against 1e-4 on
    AVX-512 machines)."""
    one, two = plain_run(algorithm), ray_run(algorithm)
    assert [r["step"] for r in one] == [r["step"] for r in two]
    assert any(r.get("actor/grad_norm", 0) > 0 for r in one), "the comparison needs real updates"
    for left, right in zip(one, two):
        assert sorted(left) == sorted(right), left["step"]
        assert_close(right, left, rel=1e-3 if algorithm == "ppo" else 1e-4)


def test_the_tolerances_are_measured_and_refuse_a_change_beyond_them():
    """Every metric of every golden file has a tolerance measured across its recorded kinds;
    a run that differs in one metric by more than its tolerance, or logs other metrics or steps,
    is refused (the check the golden test applies on an unrecorded kind)."""
    for devices in (1, 2):
        for algorithm in ("grpo", "ppo", "dpo"):
            golden = read_golden(algorithm, devices)
            recordings = golden["recordings"]
            assert len({str(r["machine"]) for r in recordings}) >= 2, (algorithm, devices)
            assert golden["tolerance"] == tolerances(recordings), "tolerances as recorded"
            want = recordings[0]["metrics"]
            allowed = {name: t["abs"] for name, t in golden["tolerance"].items()}
            for other in recordings[1:]:
                assert not differences(other["metrics"], want, allowed)
            name = "actor/loss"
            changed = [{**row, name: row[name] + 2 * allowed[name]} if name in row else row
                       for row in want]
            assert any(f"{name} " in p for p in differences(changed, want, allowed))
            assert differences(want[:-1], want, allowed)
            assert differences([{**row, "extra": 1.0} for row in want], want, allowed)
