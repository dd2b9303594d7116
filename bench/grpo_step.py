"""GRPO step time: Ascent's `RLTrainer` against TRL's `GRPOTrainer`, same model, data and batch.

    python bench/grpo_step.py [--prompts 8] [--samples 8] [--new-tokens 8] [--digits 2] \
        [--steps 20] [--warmup 2] [--lr 1e-5] [--threads N]

Both trainers start from one saved tiny Qwen2 folder (`tiny:small` shape, seed 0, about 1.02M
parameters, byte-level tokenizer), in float32 on the CPU, and train on the same synthetic
`--digits`-digit addition prompts ("12+34=", no template) rewarded by the project's
`exact_match` (Ascent scores it through its reward workers, TRL calls the same function in
process). One step on both sides: sample `--samples` responses of up to `--new-tokens` tokens
(temperature 1, stopping at eos) for `--prompts` prompts, score them, group-normalised advantages
(mean and std of each prompt's group), then one optimizer step over all of them in a single
forward/backward: PPO-clip loss (0.2) averaged over the batch's tokens (Ascent `token-mean`, TRL
`loss_type="dapo"`), entropy computed for the metrics, no KL term and no reference model (Ascent
`use_kl_loss: false`, `reference.enable: false`; TRL `beta=0`), no old-log-prob pass (one
on-policy update), fused AdamW at `--lr`, weight decay 0, constant learning rate, gradient norm
clipped to 1, no activation checkpointing. TRL's defaults that differ (bf16, activation
checkpointing, learning-rate decay, logging) are switched off.

The runners alternate step by step, so both see the same load: TRL's `train()` runs and, at the
end of each of its optimizer steps, a callback runs one `RLTrainer.train_step()`. A TRL step is
the wall time from the end of the previous Ascent step to TRL's next `on_step_end` (its data
loading, generation, scoring, forward/backward and optimizer step); an Ascent step is the call
to `train_step()`. Ascent's reward workers are started by one step before the pairs begin, and
the first `--warmup` pairs are left out. Prints the best and median of `--steps` steps of each,
the ratios of the bests, of the medians and the median of the per-pair ratios (each pair ran
under about the same load), the mean response length of each side (the same work: the random
model seldom stops before `--new-tokens`), the median of Ascent's `timing/*` stages and the
1-minute load average before and after. Other work on the machine shows up as slow steps, on
one side or both: compare figures from runs with little load. Figures only: nothing here passes
or fails on time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import PrinterCallback, TrainerCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from rl_core.data.synthetic import synthetic_splits  # noqa: E402
from rl_core.models.tiny import build_tiny, count_parameters, write_tiny  # noqa: E402
from rl_core.recipes.rl import RLTrainer  # noqa: E402
from rl_core.rewards import exact_match  # noqa: E402
from rl_core.spec import RunSpec, resolve_spec  # noqa: E402
from rl_core.tracking import Tracker  # noqa: E402

SEED = 1
NUM_TRAIN = 2000  # distinct problems; neither side reaches the end of an epoch
# TRL 1.16 reads `model.is_gradient_checkpointing`, which transformers 5 renamed to
# `is_activation_checkpointing` and warns about on every call: noise, not information.
warnings.filterwarnings(
    "ignore", message=r".*is deprecated and will be removed in v6", category=FutureWarning
)


def ascent_spec(model_dir: Path, out: Path, args: argparse.Namespace) -> RunSpec:
    return resolve_spec({
        "algorithm": "grpo",
        "seed": SEED,
        "model": {"path": str(model_dir), "dtype": "float32"},
        "data": {
            "synthetic": {
                "task": "addition", "digits": args.digits, "num_train": NUM_TRAIN, "num_val": 0,
            },
            "prompt_template": "plain",
            "train_batch_size": args.prompts,
        },
        "rollout": {"n_samples_per_prompt": args.samples, "max_new_tokens": args.new_tokens},
        "actor": {
            "lr": args.lr, "weight_decay": 0.0, "grad_clip": 1.0, "lr_scheduler": "constant",
            "ppo_mini_batch_size": args.prompts,  # one optimizer step per step
            "ppo_micro_batch_size": args.prompts * args.samples,  # one forward/backward
            "loss_agg_mode": "token-mean", "use_kl_loss": False,
        },
        "reference": {"enable": False},
        "reward": {"functions": [{"name": "exact_match"}]},
        "trainer": {
            "total_steps": 1000, "output_dir": str(out), "resume_mode": "disable", "logger": [],
        },
    })


def trl_reward(lengths: list[float]):
    """The project's `exact_match` in TRL's reward signature (`answer` is the dataset column);
    appends each batch's mean completion length in tokens (eos included) to `lengths`."""

    def exact_match_reward(completions, answer, completion_ids, **_) -> list[float]:
        lengths.append(statistics.mean(len(ids) for ids in completion_ids))
        return [exact_match(completion, truth) for completion, truth in zip(completions, answer)]

    return exact_match_reward


def trl_config(out: Path, args: argparse.Namespace, steps: int) -> GRPOConfig:
    return GRPOConfig(
        # activation_checkpointing: transformers 5's name for TRL's `gradient_checkpointing`
        # (True by default in TRL); setting the new name wins over the old one.
        output_dir=str(out), seed=SEED, use_cpu=True, bf16=False, activation_checkpointing=False,
        per_device_train_batch_size=args.prompts * args.samples,  # completions per step
        gradient_accumulation_steps=1, num_generations=args.samples, num_iterations=1,
        max_completion_length=args.new_tokens, temperature=1.0, beta=0.0, loss_type="dapo",
        scale_rewards="group", epsilon=0.2, learning_rate=args.lr, weight_decay=0.0,
        max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, max_steps=steps,
        report_to="none", logging_steps=10**9, save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0,
    )


class Alternate(TrainerCallback):
    """Times TRL's steps and runs one Ascent step after each of them."""

    def __init__(self, ascent: RLTrainer):
        self.ascent = ascent
        self.trl_times: list[float] = []
        self.ascent_times: list[float] = []
        self.ascent_metrics: list[dict[str, float]] = []
        self.threads: set[int] = set()
        self.resumed = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.resumed = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        ended = time.perf_counter()
        self.trl_times.append(ended - self.resumed)
        self.threads.add(torch.get_num_threads())
        self.ascent_metrics.append(self.ascent.train_step())
        self.resumed = time.perf_counter()
        self.ascent_times.append(self.resumed - ended)


def measure(args: argparse.Namespace) -> tuple[Alternate, list[float], int]:
    """Build both trainers on one saved model and run the alternating steps."""
    with tempfile.TemporaryDirectory(prefix="grpo-step-") as tmp:
        root = Path(tmp)
        model, tokenizer = build_tiny("small", seed=0)
        model_dir = write_tiny(model, tokenizer, root / "model")
        ascent = RLTrainer(ascent_spec(model_dir, root / "ascent", args), tracker=Tracker([]))
        ascent.train_step()  # starts the reward workers (seconds), not part of a step
        train, _ = synthetic_splits(
            "addition", num_train=NUM_TRAIN, num_val=0, seed=SEED, digits=args.digits
        )
        alternate, trl_lengths = Alternate(ascent), []
        trainer = GRPOTrainer(
            model=str(model_dir), reward_funcs=trl_reward(trl_lengths),
            args=trl_config(root / "trl", args, args.warmup + args.steps),
            train_dataset=Dataset.from_list(train), callbacks=[alternate],
        )
        trainer.remove_callback(PrinterCallback)  # the end-of-training summary
        trainer.train()
    return alternate, trl_lengths, count_parameters(model)


def report_times(name: str, times: list[float]) -> None:
    print(
        f"{name:<8}{min(times):>9.3f}{statistics.median(times):>10.3f}{1 / min(times):>9.2f}   "
        f"({', '.join(f'{t:.3f}' for t in times)})"
    )


def report(
    args: argparse.Namespace,
    alternate: Alternate,
    trl_lengths: list[float],
    parameters: int,
    loads: tuple[float, float],
) -> None:
    """Print the figures of the timed steps (the warm-up pairs left out)."""
    skip = args.warmup
    trl_times, ascent_times = alternate.trl_times[skip:], alternate.ascent_times[skip:]
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"trl {trl.__version__}; {'/'.join(map(str, sorted(alternate.threads)))} threads; "
        f"load average (1 min) {loads[0]:.2f} before, {loads[1]:.2f} after"
    )
    print(
        f"model tiny:small, {parameters:,} parameters, float32; step: {args.prompts} prompts x "
        f"{args.samples} samples, up to {args.new_tokens} new tokens, {args.digits}-digit "
        f"addition; {args.steps} timed steps after {args.warmup} warm-up"
    )
    print(f"{'runner':<8}{'best s':>9}{'median s':>10}{'steps/s':>9}   (steps)")
    report_times("trl", trl_times)
    report_times("ascent", ascent_times)
    paired = statistics.median(t / a for t, a in zip(trl_times, ascent_times))
    print(
        f"trl time / ascent time: {min(trl_times) / min(ascent_times):.2f}x (best steps), "
        f"{statistics.median(trl_times) / statistics.median(ascent_times):.2f}x (medians), "
        f"{paired:.2f}x (median of the per-pair ratios)"
    )
    timed = alternate.ascent_metrics[skip:]
    print(
        f"mean response tokens: trl {statistics.mean(trl_lengths[skip:]):.2f}, ascent "
        f"{statistics.mean(m['response_length/mean'] for m in timed):.2f} (eos included)"
    )
    stages = [k for k in timed[0] if k.startswith("timing/")]  # in the trainer's order
    print("ascent timing/* (median s; nested stages overlap): " + ", ".join(
        f"{k.removeprefix('timing/')} {statistics.median(m.get(k, 0.0) for m in timed):.3f}"
        for k in stages
    ))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="responses per prompt")
    parser.add_argument("--new-tokens", type=int, default=8, help="longest response")
    parser.add_argument("--digits", type=int, default=2, choices=[2, 3], help="digits per operand")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per trainer")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per trainer first")
    parser.add_argument("--lr", type=float, default=1e-5, help="learning rate of both")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    load_before = os.getloadavg()[0]
    alternate, trl_lengths, parameters = measure(args)
    report(args, alternate, trl_lengths, parameters, (load_before, os.getloadavg()[0]))


if __name__ == "__main__":
    main()
