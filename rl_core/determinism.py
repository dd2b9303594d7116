"""Deterministic computing (`trainer.deterministic`): what is set in every process, and a report
that proves it.

Every process of a run (the controller, each rank of each role) calls `seed_everything` when
it starts; with `trainer.deterministic` it also

- turns on PyTorch's deterministic algorithms (`torch.use_deterministic_algorithms`, with
  warnings for an operator that has no deterministic kernel rather than an error, so a run
  on a device that lacks one still trains; the report says which mode is on), cuDNN's
  deterministic mode with autotuning off, and no TF32 matmuls;
- sets the collective and kernel libraries' determinism variables (`DETERMINISTIC_ENV`):
  cuBLAS's fixed workspace (`CUBLAS_WORKSPACE_CONFIG`), HCCL's and LCCL's deterministic
  reductions and the matmul K-axis shift off on Ascend (`HCCL_DETERMINISTIC`,
  `LCCL_DETERMINISTIC`, `CLOSE_MATMUL_K_SHIFT`, `ATB_LLM_LCOC_ENABLE`), and one NCCL algorithm
  and protocol (`NCCL_ALGO=Ring`, `NCCL_PROTO=Simple`: the reduction order does not change with
  message sizes). These libraries read them when they initialise, so the Ray placement also
  puts them in each rank's environment before the process starts (`process_env`); a variable
  the user set already is kept and reported as theirs.

Seeds need no switch: every process seeds Python's, NumPy's and PyTorch's generators (and each
device's) from `seed`; the data order is a permutation drawn from (seed, epoch); rollouts draw
one seed per call from the controller's generator (the vLLM engine takes per-prompt seeds from
it); the data channel hands rows to stages in row order. `process_report` records all of it
for one process, `run_report` puts the controller's and every rank's together with the run's
data order, and the trainer stores that as `determinism.json` in the output folder and in
MLflow (`determinism/report.json`), which the run page shows.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import random
from typing import Any

import torch

log = logging.getLogger(__name__)

# The variables deterministic runs set, and why (the report lists each with its value).
DETERMINISTIC_ENV: dict[str, tuple[str, str]] = {
    "CUBLAS_WORKSPACE_CONFIG": (":4096:8", "cuBLAS: a fixed workspace, needed by deterministic "
                                           "matmuls on CUDA"),
    "HCCL_DETERMINISTIC": ("true", "HCCL: deterministic reductions on Ascend"),
    "LCCL_DETERMINISTIC": ("1", "LCCL: deterministic reductions on Ascend"),
    "CLOSE_MATMUL_K_SHIFT": ("1", "Ascend: matmul K-axis shift off"),
    "ATB_LLM_LCOC_ENABLE": ("0", "Ascend ATB: no compute/communication overlap in matmuls"),
    "NCCL_ALGO": ("Ring", "NCCL: one all-reduce algorithm whatever the message size"),
    "NCCL_PROTO": ("Simple", "NCCL: one protocol whatever the message size"),
}
# Seed-related variables recorded whatever the mode (not set: they act at interpreter start).
_RECORDED_ENV = ("PYTHONHASHSEED", "OMP_NUM_THREADS", "RL_CORE_THREADS")


def process_env(deterministic: bool) -> dict[str, str]:
    """The variables a rank's process needs in its environment before it starts."""
    if not deterministic:
        return {}
    return {name: os.environ.get(name, value) for name, (value, _) in DETERMINISTIC_ENV.items()}


def seed_everything(seed: int, deterministic: bool) -> None:
    """Seed Python's, NumPy's and PyTorch's generators (every device's too) from `seed`; with
    `deterministic`, deterministic kernels and the variables of `DETERMINISTIC_ENV`."""
    random.seed(seed)
    torch.manual_seed(seed)  # also every CUDA (and, with torch_npu loaded, NPU) device
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # numpy is optional for rl_core
        pass
    # the run's mode both ways: the local backend runs one run after another in one process
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    torch.backends.cudnn.deterministic = deterministic
    if deterministic:
        for name, value in process_env(True).items():
            os.environ.setdefault(name, value)
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def process_report(role: str, rank: int, device: Any = "cpu") -> dict[str, Any]:
    """What this process has set: its seed (PyTorch's initial seed: what `seed_everything`
    gave it), kernel modes and determinism variables."""
    env = {name: {"value": os.environ.get(name), "wanted": value, "why": why}
           for name, (value, why) in DETERMINISTIC_ENV.items()}
    return {
        "role": role, "rank": rank, "pid": os.getpid(), "host": platform.node(),
        "device": str(device), "seed": torch.initial_seed(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "env": env,
        "recorded_env": {name: os.environ.get(name) for name in _RECORDED_ENV},
    }


def run_report(spec: Any, processes: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's determinism report: the mode, what decides the order of data and samples, and
    each process's `process_report`; `consistent` is False (with `problems`) where a process
    is not in the mode the run asked for."""
    deterministic = spec.trainer.deterministic
    problems = []
    for p in processes:
        where = f"{p['role']} rank {p['rank']}"
        if p["seed"] != spec.seed:
            problems.append(f"{where}: seed {p['seed']}, the run's is {spec.seed}")
        if p["deterministic_algorithms"] != deterministic:
            problems.append(f"{where}: deterministic algorithms "
                            f"{'on' if p['deterministic_algorithms'] else 'off'}")
        for name, entry in p["env"].items() if deterministic else ():
            if entry["value"] is None:
                problems.append(f"{where}: {name} is not set")
    engine = spec.rollout.engine
    return {
        "deterministic": deterministic, "seed": spec.seed, "consistent": not problems,
        "problems": problems,
        "data_order": {
            "shuffle": spec.data.shuffle,
            "order": "a permutation per epoch drawn from (seed, epoch)" if spec.data.shuffle
            else "the dataset's order",
        },
        "sampling": {
            "rollout_engine": engine,
            "seeds": "one seed per rollout call from the controller's generator (seeded with "
                     "the run's seed, saved in checkpoints)"
                     + ("; vLLM samples each prompt from a seed drawn from it" if engine == "vllm"
                        else ""),
        },
        "channel": "rows handed to each stage in row order (ordered data channel)",
        "processes": processes,
    }


def record_determinism(spec: Any, processes: list[dict[str, Any]], output_dir: Any,
                       tracker: Any) -> dict[str, Any]:
    """`run_report` of `processes` as `<output_dir>/determinism/report.json` and in the tracker
    (MLflow: `determinism/report.json`); a process not in the run's mode is logged."""
    from pathlib import Path

    report = run_report(spec, processes)
    folder = Path(output_dir) / "determinism"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    tracker.log_artifacts(folder, "determinism")
    for problem in report["problems"]:
        log.warning("determinism: %s", problem)
    return report
