"""The golden runs' specs and files (see test_golden.py): seeded 5-step GRPO, PPO and DPO runs
on the tiny SFT base, and the machine they were recorded on.

A golden file holds the metrics and the machine's fingerprint (torch, the CPU and its vector
unit, the thread count): float32 kernels round differently across CPUs, and sampling turns a
last-bit difference into other tokens within a step or two, so recorded numbers are only
comparable on the machine kind that recorded them.
"""

from __future__ import annotations

import json
import os
import platform
import re
from pathlib import Path
from typing import Any

import torch
from test_trainer import tiny_spec

from rl_core.tracking import stable_metrics

GOLDEN = Path(__file__).parent / "golden"
RECORD = os.environ.get("ASCENT_RECORD_GOLDEN") == "1"
STEPS = 5


def pairs_file(folder: Path) -> Path:
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
    spec["data"] = {"train_files": [str(pairs_file(out.parent / f"{out.name}-data"))],
                    "chosen_key": "good", "rejected_key": "bad", "prompt_template": "plain",
                    "train_batch_size": 4}
    spec["trainer"]["eval_every"] = 0
    return spec


def comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in stable_metrics(r).items() if not k.startswith("channel/")}
            for r in rows]



def machine() -> dict[str, Any]:
    """What float32 results depend on: torch, the CPU model, its vector unit, the threads."""
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in
                   Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"torch": torch.__version__, "cpu": cpu_model(cpu),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads()}


def cpu_model(name: str) -> str:
    """The CPU's model without the clock some hypervisors append ("... Processor @ 2.60GHz"):
    the same cores round the same at any clock."""
    return re.sub(r"\s*@\s*[\d.]+\s*GHz$", "", name.strip())


def same_machine(recorded: dict[str, Any]) -> bool:
    """Whether a golden file's machine is this one (files recorded with the clock included)."""
    return {**recorded, "cpu": cpu_model(recorded.get("cpu", ""))} == machine()


def golden_path(algorithm: str, devices: int) -> Path:
    return GOLDEN / f"{algorithm}-{devices}rank.json"


def write_golden(algorithm: str, devices: int, metrics: list[dict]) -> None:
    GOLDEN.mkdir(exist_ok=True)
    golden_path(algorithm, devices).write_text(
        json.dumps({"machine": machine(), "metrics": metrics}, indent=1, sort_keys=True) + "\n")


def read_golden(algorithm: str, devices: int) -> dict[str, Any]:
    """{"machine": ..., "metrics": [...]} of a recorded run."""
    return json.loads(golden_path(algorithm, devices).read_text())
