"""The golden runs' base, specs and files (see test_golden.py): seeded 5-step GRPO, PPO and DPO
runs on the tiny SFT base, the machines they were recorded on, and the tolerances measured
across those machines.

    python tests/training/golden_runs.py base      # rebuild the committed SFT base (on purpose)
    python tests/training/golden_runs.py record    # record the runs on this machine's kinds

Why the runs hold by construction:
- The SFT base is committed (`golden/base`), not trained in the session: 120 SFT steps turn a
  last-bit difference between two CPUs' kernels into weights 0.08 apart (measured between this
  project's AVX-512 and AVX2 kernels), and every later number with them. From the same base, five
  RL steps stay within about 1e-5 of each other across kernels.
- The 2-rank runs are deterministic (`trainer.deterministic`): each rank computes fixed spans of
  rows, so which rank pulls which row from the data channel does not depend on timing. They
  shard the weights (FSDP2); data parallelism with the plain engine is compared with one rank in
  tests/training/test_distributed.py.
- A file holds one recording per machine kind. On a recorded kind the run must equal its
  recording; on any other kind it must be within the tolerance of each metric, measured as the
  spread between the recorded kinds (written beside each metric with its reason).

`record` runs the golden tests once per kind of kernels this machine can run: its own, and
PyTorch's, MKL's and oneDNN's AVX2 and (for the scalar spread) no-vector paths, which stand for
the AVX2-only machines CI also lands on. A machine whose kernels are limited this way is
recorded with the limits in its fingerprint, so it never counts as a real machine of that kind.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from learning import LEARNING_DATA
from test_trainer import tiny_spec

from rl_core.tracking import stable_metrics

GOLDEN = Path(__file__).parent / "golden"
BASE = GOLDEN / "base"
BASE_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
              "tokenizer_config.json", "chat_template.jinja")
RECORD = os.environ.get("ASCENT_RECORD_GOLDEN") == "1"
STEPS = 5
# The variables that limit the vector units of PyTorch's, MKL's and oneDNN's kernels, and the
# kinds `record` emulates with them (the empty one is the machine as it is).
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")
EMULATED_KINDS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "scalar": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
               "ONEDNN_MAX_CPU_ISA": "SSE41"},
}
# Cross-kind tolerance of a metric: SAFETY times the largest difference seen between recorded
# kinds, and at least FLOOR_REL of the metric's largest value (a metric that was equal on every
# recorded kind, such as a reward, may still differ in its last bits elsewhere).
# Threads of the in-process (one-rank) runs: a sum split over more threads rounds otherwise, so
# the runs use this many on any machine (each Ray rank computes on one, its share of a CPU).
THREADS = 1
SAFETY = 10.0
FLOOR_REL = 1e-6
FLOOR_ABS = 1e-9
# Fractions of a few items: one item more or less is a step of 1/items, not a rounding error. A
# recorded spread there is an item on a tie that rounded the other way on another kind (DPO's
# first pairs, scored while the policy still equals the reference, have margins of a rounding
# error), so such a metric is allowed the spread seen, not SAFETY times it: ten of 0.25 would let
# an accuracy of four pairs be anything; and one item at least, on a kind whose recordings all
# agreed (such a tie flipped on an Intel AVX-512 CPU against three AMD kinds).
# The number of items each such fraction counts in a step (DPO: the 4 pairs of a batch).
COUNTED = {"dpo/rewards/accuracies": 4}


# --------------------------------------------------------------------------- the base


def build_base(folder: Path) -> Path:
    """Train the base (tiny:small, 120 SFT steps on one-digit addition: right only part of the
    time) and write its Hugging Face files to `folder`."""
    from rl_core.recipes.sft import SFTTrainer
    from rl_core.spec import resolve_spec

    work = folder.parent / f"{folder.name}-training"
    SFTTrainer(resolve_spec({
        "algorithm": "grpo", "seed": 1, "model": {"path": "tiny:small"},
        "data": {**LEARNING_DATA, "train_batch_size": 32},
        "rollout": {"n_samples_per_prompt": 2, "max_new_tokens": 4},
        "actor": {"lr": 2e-3, "warmup_steps": 10, "ppo_mini_batch_size": 32,
                  "ppo_micro_batch_size": 32},
        "reward": {"functions": [{"name": "exact_match"}]},
        "trainer": {"total_steps": 120, "output_dir": str(work), "logger": []},
    })).fit()
    folder.mkdir(parents=True, exist_ok=True)
    for name in BASE_FILES:
        shutil.copy2(work / "checkpoints" / "step_120" / name, folder / name)
    shutil.rmtree(work)
    return folder


# --------------------------------------------------------------------------- the runs


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


def sharded_spec(algorithm: str, base: Path, out: Path, devices: int, **trainer) -> dict:
    """`golden_spec` with the roles' weights sharded (`actor.strategy: fsdp2`)."""
    spec = golden_spec(algorithm, base, out, devices)
    spec["actor"] = {**spec.get("actor", {}), "strategy": "fsdp2"}
    spec["trainer"] = {**spec["trainer"], **trainer}
    return spec


def golden_run_spec(algorithm: str, base: Path, out: Path, devices: int) -> dict:
    """The golden test's spec: `golden_spec` with the plain engine on one rank; on more, sharded
    (FSDP2, the engine that scales) and deterministic (fixed channel spans per rank, so the
    numbers do not depend on which rank was free first); GRPO's with precision dumps of step 2
    on both ranks."""
    if devices == 1:
        return golden_spec(algorithm, base, out, devices)
    spec = sharded_spec(algorithm, base, out, devices, deterministic=True)
    if algorithm == "grpo":  # test_determinism.py runs it again and compares these dumps too
        spec["tools"] = {"precision": {"enable": True, "steps": [2], "ranks": [0, 1]}}
    return spec


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch computes on `count` threads inside the block (as before it, after)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def comparable(rows: list[dict]) -> list[dict]:
    """The metrics a run's numbers decide: not timings (`stable_metrics`), not the data
    channel's waits, not what the tools wrote (`precision/files`)."""
    return [{k: v for k, v in stable_metrics(r).items()
             if not k.startswith(("channel/", "precision/"))} for r in rows]


# --------------------------------------------------------------------------- machines


def machine() -> dict[str, Any]:
    """What float32 results depend on: torch, the CPU model, its vector unit, the threads (fixed
    to THREADS for the runs), and any limit set on the kernels' vector units (an emulated
    kind)."""
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in
                   Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    found = {"torch": torch.__version__, "cpu": cpu_model(cpu),
             "capability": torch.backends.cpu.get_cpu_capability(),
             "threads": THREADS}
    limits = {name: os.environ[name] for name in ISA_LIMITS if os.environ.get(name)}
    if limits:
        found["limits"] = limits
    return found


def cpu_model(name: str) -> str:
    """The CPU's model without the clock some hypervisors append ("... Processor @ 2.60GHz"):
    the same cores round the same at any clock."""
    return re.sub(r"\s*@\s*[\d.]+\s*GHz$", "", name.strip())


def same_machine(recorded: dict[str, Any]) -> bool:
    """Whether a recording's machine is this one (recordings made with the clock included)."""
    return {**recorded, "cpu": cpu_model(recorded.get("cpu", ""))} == machine()


# --------------------------------------------------------------------------- files


def golden_path(algorithm: str, devices: int) -> Path:
    return GOLDEN / f"{algorithm}-{devices}rank.json"


def read_golden(algorithm: str, devices: int) -> dict[str, Any]:
    """{"recordings": [{"machine": ..., "metrics": [...]}, ...], "tolerance": {metric: ...}}."""
    path = golden_path(algorithm, devices)
    return json.loads(path.read_text()) if path.exists() else {"recordings": [], "tolerance": {}}


def write_golden(algorithm: str, devices: int, metrics: list[dict]) -> None:
    """Record this machine's run (replacing its earlier recording) and measure the tolerances
    again across every recording."""
    kept = [r for r in read_golden(algorithm, devices)["recordings"]
            if not same_machine(r["machine"])]
    recordings = [*kept, {"machine": machine(), "metrics": metrics}]
    GOLDEN.mkdir(exist_ok=True)
    golden_path(algorithm, devices).write_text(json.dumps(
        {"recordings": recordings, "tolerance": tolerances(recordings)},
        indent=1, sort_keys=True) + "\n")


def tolerances(recordings: list[dict]) -> dict[str, dict[str, Any]]:
    """Per metric: the spread (largest difference at one step between any two recordings), the
    tolerance allowed on a kind that was not recorded, and why."""
    names = sorted({k for r in recordings for row in r["metrics"] for k in row} - {"step"})
    kinds = len(recordings)
    out = {}
    for name in names:
        spread, at, scale = 0.0, None, 0.0
        for rows in zip(*(r["metrics"] for r in recordings)):
            values = [row[name] for row in rows if name in row]
            if not values:
                continue
            scale = max(scale, *(abs(v) for v in values))
            if max(values) - min(values) > spread:
                spread, at = max(values) - min(values), rows[0]["step"]
        floor = max(FLOOR_REL * scale, FLOOR_ABS)
        if name in COUNTED:  # one item on a tie may round either way on any kind
            floor = max(floor, 1 / COUNTED[name] + 1e-9)
        safety = 1.0 if name in COUNTED else SAFETY
        allowed = max(safety * spread, floor)
        seen = f"{kinds} recorded kinds differ by at most {spread:.3g}"
        if name in COUNTED and spread <= floor:
            why = f"{seen}; a count of {COUNTED[name]} items: one on a tie may flip, no more"
        elif spread * safety <= floor:
            why = f"{seen}; the floor, {FLOOR_REL:g} of its largest value {scale:.3g}"
        elif name in COUNTED:
            why = f"{seen} (step {at}); a count of items: one on a tie may flip, no more"
        else:
            why = f"{seen} (step {at}); {SAFETY:g}x that"
        out[name] = {"spread": spread, "abs": allowed, "why": why}
    return out


def assert_close(got: dict, want: dict, rel: float = 1e-4) -> None:
    """Equal up to the rounding of sums taken in another order (more ranks, sharded weights). A
    clip fraction counts tokens on either side of a threshold, and the critic's first values sit
    exactly on it (new values = old values): there rounding moves a token or two, so a clip
    fraction may differ by 2 %. A fraction of a few items (`COUNTED`) may differ by one item:
    an item on a tie (a DPO pair whose margin is a rounding error) may round either way. `rel`:
    the relative tolerance of the rest."""
    import pytest

    for name, value in want.items():
        tolerance = {"abs": 0.02} if name.endswith("clipfrac") else {"rel": rel, "abs": 1e-5}
        if name in COUNTED:
            tolerance = {"abs": 1 / COUNTED[name] + 1e-9}
        assert got[name] == pytest.approx(value, **tolerance), (got["step"], name)


def differences(got: list[dict], want: list[dict], allowed: dict[str, float]) -> list[str]:
    """What differs between two runs' metrics beyond `allowed` (metric -> absolute tolerance):
    steps and metric names must be the same; an empty list when they agree."""
    problems = []
    if [r["step"] for r in got] != [r["step"] for r in want]:
        return [f"steps {[r['step'] for r in got]} != {[r['step'] for r in want]}"]
    for a, b in zip(got, want):
        if sorted(a) != sorted(b):
            problems.append(f"step {a['step']}: metrics {sorted(set(a) ^ set(b))} differ")
            continue
        for name in sorted(set(a) - {"step"}):
            if not abs(a[name] - b[name]) <= allowed.get(name, 0.0):
                problems.append(f"step {a['step']}: {name} {a[name]!r} vs {b[name]!r} "
                                f"(allowed {allowed.get(name, 0.0):.3g})")
    return problems


# --------------------------------------------------------------------------- commands


def record() -> int:
    """The golden tests once per kind this machine's kernels can be (see EMULATED_KINDS)."""
    test = str(Path(__file__).with_name("test_golden.py"))
    for kind, limits in EMULATED_KINDS.items():
        print(f"[golden] recording the {kind} kind {limits or ''}", flush=True)
        env = {**{k: v for k, v in os.environ.items() if k not in ISA_LIMITS}, **limits,
               "ASCENT_RECORD_GOLDEN": "1"}
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", test, "-k", "recorded_run"],
                              env=env, cwd=Path(__file__).resolve().parents[2])
        if done.returncode:
            return done.returncode
    return 0


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "base":
        shutil.rmtree(BASE, ignore_errors=True)
        print(build_base(BASE))
    elif command == "record":
        sys.exit(record())
    else:
        sys.exit(__doc__)
