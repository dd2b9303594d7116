"""What the tools cost: a profiled step and a precision-dumped step against plain steps.

    python bench/tools.py [--size nano] [--steps 6] [--at 4] [--prompts 4] [--n 4] \
        [--new-tokens 16] [--algorithm ppo] [--threads N]

Three runs of one local RL trainer on a seeded tiny model (PPO with a critic and a reference
by default, so every profiled stage occurs): no tool, `tools.profiling` on step `--at` (every
stage, rank 0, level0), and `tools.precision` on step `--at` (statistics of every module and the
stages' data). Step 1 pays one-off warm-up and is not counted. Prints each run's median step
time over the plain steps, the tool's step, the extra seconds and that extra in plain steps
(the aim: under a few steps), and the size of what the tool wrote. Figures only: nothing here
passes or fails on time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_core.recipes.rl import RLTrainer  # noqa: E402
from rl_core.spec import resolve_spec  # noqa: E402


def spec(out: Path, args: argparse.Namespace, tools: dict) -> dict:
    ppo = args.algorithm == "ppo"
    return {
        "algorithm": args.algorithm, "seed": 1, "model": {"path": f"tiny:{args.size}"},
        "data": {"synthetic": {"task": "addition", "digits": 2, "num_train": 256, "num_val": 0},
                 "prompt_template": "plain", "train_batch_size": args.prompts},
        "rollout": {"n_samples_per_prompt": args.n, "max_new_tokens": args.new_tokens},
        "actor": {"lr": 1e-4, "ppo_mini_batch_size": args.prompts, "ppo_micro_batch_size": 8,
                  "use_kl_loss": True},
        "reference": {"enable": True},
        **({"critic": {"enable": True}, "advantage": {"adv_estimator": "gae"}} if ppo else {}),
        "reward": {"functions": [{"name": "exact_match"}]},
        "trainer": {"total_steps": args.steps, "save_every": 0, "output_dir": str(out)},
        "tools": tools,
    }


def run(out: Path, args: argparse.Namespace, tools: dict) -> tuple[list[float], int]:
    RLTrainer(resolve_spec(spec(out, args, tools))).fit()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    written = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()
                  and f.parent != out and "checkpoints" not in f.parts and "determinism"
                  not in f.parts)
    return [r["timing/step"] for r in rows], written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="nano")
    parser.add_argument("--algorithm", default="ppo", choices=["ppo", "grpo"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--at", type=int, default=4, help="the profiled / dumped step")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if not 1 < args.at <= args.steps:
        parser.error("--at must be a step after the first and at most --steps")
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = {"plain": {},
             "profiling": {"profiling": {"enable": True, "steps": [args.at]}},
             "precision": {"precision": {"enable": True, "steps": [args.at]}}}
    print(f"{args.algorithm}, tiny:{args.size}, {args.prompts}x{args.n} responses of up to "
          f"{args.new_tokens} tokens, {args.steps} steps, tool on step {args.at}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'mode':<10} {'plain step s':>12} {'tool step s':>11} {'extra s':>8} "
          f"{'extra steps':>11} {'written':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for mode, tools in modes.items():
            times, written = run(Path(tmp) / mode, args, tools)
            plain = statistics.median(t for i, t in enumerate(times, 1)
                                      if i not in (1, args.at))
            tool = times[args.at - 1]
            extra = tool - plain
            print(f"{mode:<10} {plain:>12.3f} {tool:>11.3f} {extra:>8.3f} "
                  f"{extra / plain:>11.1f} {written / 1e6:>8.2f} MB")


if __name__ == "__main__":
    main()
