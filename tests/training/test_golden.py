"""Golden runs: seeded 5-step GRPO, PPO and DPO runs on the tiny SFT base (right part of the
time, so rewards differ within groups), in process and on two Ray
ranks, whose metrics must stay what they were when recorded (tests/training/golden/*.json).

A change to rl_core that is meant to keep behaviour (a restructuring, a new engine behind the
same default) must leave these exactly as they are, up to floating-point rounding. A change that
is meant to alter the numbers re-records them on purpose:

    ASCENT_RECORD_GOLDEN=1 .venv/bin/python -m pytest tests/training/test_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from test_trainer import read_metrics, tiny_spec

from rl_core.recipes import run
from rl_core.spec import resolve_spec
from rl_core.tracking import stable_metrics

GOLDEN = Path(__file__).parent / "golden"
RECORD = os.environ.get("ASCENT_RECORD_GOLDEN") == "1"
STEPS = 5


def _pairs_file(folder: Path) -> Path:
    """Preference pairs over one-digit additions: the right sum preferred to the next one."""
    path = folder / "pairs.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"prompt": f"{a}+{b}=", "good": str(a + b), "bad": str(a + b + 1)})
             for a in range(4) for b in range(4)]
    path.write_text("\n".join(lines) + "\n")
    return path


def golden_spec(algorithm: str, base: Path, out: Path, devices: int) -> dict:
    common = {"model": {"path": str(base)}, "resources": {"devices_per_node": devices},
              "trainer": {"total_steps": STEPS, "eval_every": 5}}
    if algorithm == "grpo":
        return tiny_spec(out, **common)
    if algorithm == "ppo":  # a critic, GAE, no reference
        return tiny_spec(out, algorithm="ppo", reference={"enable": False},
                         actor={"use_kl_loss": False}, critic={"enable": True, "lr": 1e-3},
                         advantage={"adv_estimator": "gae", "gamma": 1.0, "lam": 1.0}, **common)
    spec = tiny_spec(out, algorithm="dpo", actor={"ppo_epochs": 1}, **common)
    spec["data"] = {"train_files": [str(_pairs_file(out.parent / f"{out.name}-data"))],
                    "chosen_key": "good", "rejected_key": "bad", "prompt_template": "plain",
                    "train_batch_size": 4}
    spec["trainer"]["eval_every"] = 0
    return spec


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in stable_metrics(r).items() if not k.startswith("channel/")}
            for r in rows]


@pytest.mark.parametrize("algorithm", ["grpo", "ppo", "dpo"])
@pytest.mark.parametrize("devices", [1, 2])
def test_metrics_equal_the_recorded_run(algorithm, devices, tmp_path, sft_base, request):
    if devices > 1:
        request.getfixturevalue("local_ray")
    out = tmp_path / "run"
    spec = resolve_spec(golden_spec(algorithm, sft_base, out, devices))
    run(spec, backend="ray" if devices > 1 else "local")
    logged = _comparable(read_metrics(out))
    path = GOLDEN / f"{algorithm}-{devices}rank.json"
    if RECORD:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(logged, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(path.read_text())
    assert [r["step"] for r in logged] == [r["step"] for r in recorded]
    assert len(recorded) >= STEPS, "a golden run logs every step"
    for got, want in zip(logged, recorded):
        assert sorted(got) == sorted(want), got["step"]
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7), got["step"]
