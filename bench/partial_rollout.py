"""Rollout wall time per step with and without partial rollout, on a long-tail length distribution.

    python bench/partial_rollout.py [--size small] [--prompts 8] [--n 8] [--new-tokens 256] \
        [--splits 2,4,8] [--stop-tokens 6] [--steps 6] [--warmup 1] [--engine native] \
        [--device cpu] [--threads N]

The lengths are controlled: a seeded untrained tiny Qwen2 model samples almost uniformly from
its 259-token vocabulary, and its generation config ends a response at `--stop-tokens` byte ids
besides eos, so each token stops a response with probability about stop-tokens / 259: lengths
are geometric, mean about 259 / 6 = 43 tokens by default, capped at `--new-tokens` (256), and
the longest of a step's 64 responses is typically four to five times the mean, the long tail
that makes a whole-batch rollout wait for its slowest response.

One RL trainer per mode (no partial rollout, then `rollout.partial_rollout_max_split` = each of
`--splits`) on the same model and prompts, its roles in this process; the modes alternate step
by step, each step being what the trainer's `generate_batch` does before the reward: the whole
batch in one call (`Controller.generate`, `--prompts` × `--n` responses of up to `--new-tokens`
tokens), or the calls of a partial step (`Controller.generate_partial`) until `--prompts`
groups are complete. No update runs (the policy stays the same, its version counts up per step),
so only the rollout is timed. `--warmup` steps per mode are not counted; the partial modes' first
steps also fill their buffer (the figures are of the steps after).

Prints per mode: seconds per step (median and mean over the counted steps), rollout calls per
step, tokens of the trained responses per step, tokens/s, the speed-up against the whole-batch
rollout, and the mean and largest age (policy versions) of the trained responses. On a CPU a
decoding step costs about in proportion to the rows still running (the native engine compacts
finished rows), so the straggler is cheap there; on an accelerator a step costs about the same
for 1 or 64 rows, which is where the partial calls' full batches pay. Figures only: nothing here
passes or fails on time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_core.models.tiny import build_tiny, write_tiny  # noqa: E402
from rl_core.recipes.rl import RLTrainer  # noqa: E402
from rl_core.spec import resolve_spec  # noqa: E402


def stop_model(folder: Path, size: str, stop_tokens: int) -> Path:
    """The seeded tiny model, with `stop_tokens` byte ids ending a response besides eos."""
    model, tokenizer = build_tiny(size)
    step = max(1, 256 // stop_tokens)
    stops = list(range(3, 256, step))[:stop_tokens]
    config = model.generation_config
    config.eos_token_id = sorted({*config.eos_token_id, *stops})
    return write_tiny(model, tokenizer, folder)


def trainer(model: Path, out: Path, split: int, args: argparse.Namespace) -> RLTrainer:
    return RLTrainer(resolve_spec({
        "algorithm": "grpo", "seed": 1, "model": {"path": str(model)},
        "data": {"synthetic": {"task": "addition", "digits": 2, "num_train": 512, "num_val": 8},
                 "prompt_template": "plain", "train_batch_size": args.prompts},
        "rollout": {"n_samples_per_prompt": args.n, "max_new_tokens": args.new_tokens,
                    "partial_rollout_max_split": split, "engine": args.engine},
        "actor": {"use_kl_loss": False, "ppo_mini_batch_size": args.prompts},
        "reference": {"enable": False},
        "reward": {"functions": [{"name": "exact_match"}]},
        "resources": {"device_type": args.device},
        "trainer": {"total_steps": args.steps + args.warmup, "output_dir": str(out),
                    "logger": []},
    }))


def rollout_step(t: RLTrainer) -> tuple[float, dict[str, float], torch.Tensor]:
    """One step's rollout: (seconds, partial metrics, response lengths of the trained batch)."""
    started = time.perf_counter()
    if t.partial is None:
        prompts = t.train.take(next(t.ctl.loader))
        batch, metrics = t.ctl.generate(prompts.ids, t.sampling), {"rollout/partial/calls": 1.0}
    else:
        batch, _, metrics = t.ctl.generate_partial(t.partial, t.train, t.spec.data.train_batch_size)
    seconds = time.perf_counter() - started
    t.ctl.step += 1  # the next policy version (no update runs: the weights stay)
    return seconds, metrics, batch.response_lengths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--splits", default="2,4,8")
    parser.add_argument("--stop-tokens", type=int, default=6)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--engine", default="native", choices=["native", "vllm"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    splits = [0, *(int(s) for s in args.splits.split(","))]
    with tempfile.TemporaryDirectory() as tmp:
        model = stop_model(Path(tmp) / "model", args.size, args.stop_tokens)
        trainers = {split: trainer(model, Path(tmp) / f"run-{split}", split, args)
                    for split in splits}
        runs: dict[int, list] = {split: [] for split in splits}
        try:
            for step in range(args.warmup + args.steps):
                for split, t in trainers.items():  # the modes alternate step by step
                    result = rollout_step(t)
                    if step >= args.warmup:
                        runs[split].append(result)
        finally:
            for t in trainers.values():
                t.close()
    report(runs, args)


def report(runs: dict[int, list], args: argparse.Namespace) -> None:
    lengths = torch.cat([r[2] for r in runs[0]]).float()
    print(f"size {args.size}, {args.prompts} prompts x {args.n}, up to {args.new_tokens} new "
          f"tokens, {args.stop_tokens} stop tokens, engine {args.engine} on {args.device}, "
          f"{torch.get_num_threads()} threads, {args.steps} steps (+{args.warmup} warm-up)")
    print(f"whole-batch response lengths: mean {lengths.mean():.1f}, median "
          f"{lengths.median():.0f}, p90 {lengths.quantile(0.9):.0f}, max {lengths.max():.0f}")
    print(f"{'mode':<10} {'median s':>9} {'mean s':>8} {'calls':>6} {'tokens':>7} "
          f"{'tokens/s':>9} {'speed-up':>9} {'mean age':>9} {'max age':>8}")
    base = statistics.median(r[0] for r in runs[0])
    for split, results in runs.items():
        seconds = [r[0] for r in results]
        tokens = statistics.mean(float(r[2].sum()) for r in results)
        calls = statistics.mean(r[1]["rollout/partial/calls"] for r in results)
        ages = [r[1].get("rollout/partial/mean_age", 1.0) for r in results]
        max_age = max(r[1].get("rollout/partial/max_age", 1.0) for r in results)
        median = statistics.median(seconds)
        name = "whole" if split == 0 else f"split {split}"
        print(f"{name:<10} {median:>9.3f} {statistics.mean(seconds):>8.3f} {calls:>6.1f} "
              f"{tokens:>7.0f} {tokens / statistics.mean(seconds):>9.0f} "
              f"{base / median:>8.2f}x {statistics.mean(ages):>9.2f} {max_age:>8.0f}")


if __name__ == "__main__":
    main()
