"""GRPO step time: Ascent's `RLTrainer` against TRL's `GRPOTrainer`, same model, data and batch.

    python bench/grpo_step.py [--size small|30m] [--prompts 8] [--samples 8] [--new-tokens N] \
        [--digits 2] [--steps 20] [--warmup 2] [--lr 1e-5] [--threads N] [--padded] \
        [--micro-batches K]

Both trainers start from one saved tiny Qwen2 folder (seed 0, byte-level tokenizer, float32 on
the CPU) of the `--size` shape, the models of bench/train_flops.py's `SIZES`:

- `small` (default): the `tiny:small` preset, about 1.02M parameters, up to 8 new tokens; the
  random model seldom stops before the limit. Aim: a paired ratio of at least 3x TRL.
- `30m`: hidden 512, 8 layers, 8 heads (4 kv), intermediate 2048, about 31.6M parameters, up to
  128 new tokens with a long tail of response lengths (below). Aims: a paired ratio of at least
  2x TRL, and Ascent's update within 1.3x of its compute floor.

`--prompts`, `--samples` and `--new-tokens` override the shape's 8 x 8 and its limit. Both train
on the same synthetic `--digits`-digit addition prompts ("12+34=", no template) rewarded by the
project's `exact_match` (Ascent's reward role calls it in its own process, the default for this
cheap rule; TRL calls the same function in process). One step on both sides: sample `--samples`
responses of up to `--new-tokens` tokens (temperature 1, stopping at either eos id of the
model's generation config) for `--prompts` prompts, score them, group-normalised advantages
(mean and std of each prompt's group), then one optimizer step over all of them: PPO-clip loss
(0.2) averaged over the batch's tokens (Ascent `token-mean`, TRL `loss_type="dapo"`), entropy
computed for the metrics, no KL term and no reference model (Ascent `use_kl_loss: false`,
`reference.enable: false`; TRL `beta=0`), no old-log-prob pass (one on-policy update), fused
AdamW at `--lr`, weight decay 0, constant learning rate, gradient norm clipped to 1, no
activation checkpointing. TRL's defaults that differ (bf16, activation checkpointing,
learning-rate decay, logging) are switched off; TRL computes the whole batch in one padded
forward/backward. Ascent runs its best layout: `actor.use_remove_padding: true` (each
micro-batch's rows packed into one sequence of their real tokens) and `actor.use_dynamic_bsz:
true` with `actor.max_token_len_per_gpu` = the mini-batch's expected real tokens (prompts x
samples x (mean prompt + expected response length)) x 1.25 / `--micro-batches` (1 for `small`,
2 for `30m`), at least one whole sequence; `--padded` runs it as TRL does instead (one padded
forward/backward of all rows), for comparison.

The long tail (`30m`): a random model stops only by chance (about 2/263 a token). The saved
model is changed once, before either trainer loads it, so that it stops with a roughly constant
hazard per token, which gives roughly geometric response lengths: the eos token's embedding row
(tied: also its row of the LM head) becomes c * u, u the unit mean direction of the model's
final (post-norm) hidden states, so the eos logit is c times each state's component along u
(positive, and about the same at every position of a response; it differs more from one
response to another, so the lengths are a mixture of geometric ones, with a heavier tail). One
`model.generate` samples 64 responses (distinct prompts, temperature 1) with both eos ids
suppressed, to the full length; u is the mean of the first 32's states. Since the eos row
changes only the eos logit, the other tokens' distribution given no stop is the same for every
c, so the length distribution for any c follows exactly from the states of the other 32 (per
response: the stop chance at each position, then the chance to get there), and c is set by
bisection so that their expected mean response is a quarter of `--new-tokens` (a few per cent
of the responses then reach it). c is set on other responses than u was measured on: on the
same ones the states lean towards u and the responses of the trainers came out about 1.5x
longer than aimed at. The calibration's expected distribution is printed beside what each side
then sampled.

The runners alternate step by step, so both see the same load: TRL's `train()` runs and, at the
end of each of its optimizer steps, a callback runs one `RLTrainer.train_step()`. A TRL step is
the wall time from the end of the previous Ascent step to TRL's next `on_step_end` (its data
loading, generation, scoring, forward/backward and optimizer step); an Ascent step is the call
to `train_step()`. Ascent takes one step before the pairs begin (its one-off setup) and the
first `--warmup` pairs are left out. Prints the best and median of `--steps` steps of each, the
ratios of the bests, of the medians and the median of the per-pair ratios (each pair ran under
about the same load) beside the aim, the response lengths each side sampled (mean, p50, p90,
max, share at the limit, eos included), the median of Ascent's `timing/*` stages, and the
update's compute floor: 6 N x (real tokens of the update: prompt and response tokens of the
batch, `perf/total_tokens`) at this machine's float32 matmul peak (bench/train_flops.py's
`matmul_peak`, the best of a measurement before and one after the pairs), with Ascent's median
`timing/update` over it; and the 1-minute load average before and after. Other work on the
machine shows up as slow steps, on one side or both: compare figures from runs with little
load. Figures only: nothing here passes or fails on time.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import PrinterCallback, TrainerCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from bench.train_flops import SIZES as MODEL_SIZES  # noqa: E402
from bench.train_flops import matmul_peak  # noqa: E402
from rl_core.data.synthetic import synthetic_splits  # noqa: E402
from rl_core.models.tiny import build_tiny, count_parameters, write_tiny  # noqa: E402
from rl_core.recipes.rl import RLTrainer  # noqa: E402
from rl_core.rewards import exact_match  # noqa: E402
from rl_core.spec import RunSpec, resolve_spec  # noqa: E402
from rl_core.tracking import Tracker  # noqa: E402

SEED = 1
NUM_TRAIN = 2000  # distinct problems; neither side reaches the end of an epoch
CALIBRATION_ROWS = 64  # responses sampled to calibrate the stop: half for u, half for c
BUDGET_SLACK = 1.25  # token budget over the expected real tokens per micro-batch
# TRL turns activation checkpointing on by default; later transformers 5 releases (not 5.19)
# renamed the field `gradient_checkpointing` to `activation_checkpointing`, and the new name
# wins over the old one where both exist.
CHECKPOINTING = (
    "activation_checkpointing" if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
    else "gradient_checkpointing"
)
# TRL 1.16 reads `model.is_gradient_checkpointing`, which transformers 5 renamed to
# `is_activation_checkpointing` and warns about on every call: noise, not information.
warnings.filterwarnings(
    "ignore", message=r".*is deprecated and will be removed in v6", category=FutureWarning
)


@dataclass(frozen=True)
class Size:
    """A `--size`: the model (tiny preset, shape overrides), the default longest response, the
    mean response length aimed at as a share of it (None: the random model's own), Ascent's
    micro-batches per update, and the aims (paired ratio; update / floor, None: no aim)."""

    model: tuple[str, dict[str, int]]
    new_tokens: int
    mean_share: float | None
    micro_batches: int
    aim_ratio: float
    aim_floor: float | None


SIZES = {
    "small": Size(MODEL_SIZES["small"], 8, None, 1, 3.0, None),
    "30m": Size(MODEL_SIZES["30m"], 128, 0.25, 2, 2.0, 1.3),
}


# ----------------------------------------------------------------- the long tail of lengths


@dataclass(frozen=True)
class Tail:
    """The calibrated stop: the eos row's scale `c` and what it gives over the sampled rows:
    `lengths` (T,) the chance that a response is t + 1 tokens long, `hazard` (T,) the mean
    chance to stop at each response position."""

    scale: float
    lengths: torch.Tensor
    hazard: torch.Tensor


def stop_ids(model) -> list[int]:
    """Every id that ends a response (the generation config's eos ids, as both trainers use)."""
    ids = model.generation_config.eos_token_id
    return [ids] if isinstance(ids, int) else list(ids)


def final_states(model, tokenizer, prompts: list[str], new_tokens: int) -> torch.Tensor:
    """Final (post-norm) hidden states (rows, new_tokens, d) before each token of responses
    sampled at temperature 1 without stopping (every eos id suppressed)."""
    rows = [tokenizer(p)["input_ids"] for p in prompts]
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # (rows, P), left-padded
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    states: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_hook(lambda m, i, out: states.append(out[:, -1:]))
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=True,
                temperature=1.0, top_k=0, top_p=1.0, suppress_tokens=stop_ids(model),
            )
    finally:
        hook.remove()
    return torch.cat(states, dim=1)[:, :new_tokens]  # the last token needs no forward


def stop_hazard(logits: torch.Tensor, along: torch.Tensor, scale: float, eos: int,
                stops: list[int]) -> torch.Tensor:
    """Chance (rows, T) of a stop token at each position when the eos logit is scale * along.

    logits (rows, T, V) of the other tokens; along (rows, T) the states' component along u."""
    logits = logits.clone()
    logits[..., eos] = scale * along
    return logits.softmax(-1)[..., stops].sum(-1)


def length_chances(hazard: torch.Tensor) -> torch.Tensor:
    """(T,) chance that a response is t + 1 tokens long (eos included), averaged over rows,
    from the stop chance (rows, T) at each position; length T whatever its last token is."""
    reach = torch.cumprod(1 - hazard, dim=-1)  # (rows, T): no stop up to and including t
    before = torch.cat([torch.ones_like(reach[:, :1]), reach[:, :-1]], dim=-1)
    chances = before * hazard
    chances[:, -1] = before[:, -1]
    return chances.mean(0)


def mean_length(chances: torch.Tensor) -> float:
    return float((chances * torch.arange(1, len(chances) + 1)).sum())


def calibrate_tail(model, tokenizer, prompts: list[str], new_tokens: int, share: float) -> Tail:
    """Set the eos row to c * u (module docstring) so the mean response is share * new_tokens;
    returns c and the expected lengths (over the rows c was set on). The model is changed in
    place."""
    states = final_states(model, tokenizer, prompts, new_tokens)  # (rows, T, d)
    half = len(prompts) // 2
    direction = states[:half].mean((0, 1))
    direction = direction / direction.norm()
    states = states[half:]  # c from other rows: u leans towards the rows it was measured on
    along = states @ direction  # (rows - half, T)
    with torch.no_grad():
        logits = model.lm_head(states)  # (rows - half, T, V)
    eos, stops = tokenizer.eos_token_id, stop_ids(model)

    def mean_at(scale: float) -> float:
        return mean_length(length_chances(stop_hazard(logits, along, scale, eos, stops)))

    target, low, high = share * new_tokens, 0.0, 1.0
    if mean_at(low) <= target:
        raise ValueError(
            f"the model already stops sooner than {target:g} tokens on average: raise --new-tokens"
        )
    while mean_at(high) > target:
        low, high = high, 2 * high
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if mean_at(middle) > target else (low, middle)
    scale = (low + high) / 2
    with torch.no_grad():
        model.get_output_embeddings().weight[eos] = scale * direction  # tied: the input row too
    hazard = stop_hazard(logits, along, scale, eos, stops)
    return Tail(scale, length_chances(hazard), hazard.mean(0))


# ------------------------------------------------------------------------- the two trainers


def token_budget(args: argparse.Namespace, padded: RunSpec, prompt_tokens: float,
                 response_tokens: float) -> int:
    """`actor.max_token_len_per_gpu`: the mini-batch's expected real tokens in
    `--micro-batches` parts, with slack, and at least one whole sequence (the spec's rule)."""
    real = args.prompts * args.samples * (prompt_tokens + response_tokens)
    longest = padded.data.max_prompt_length + padded.rollout.max_new_tokens
    return max(longest, math.ceil(real * BUDGET_SLACK / args.micro_batches))


def ascent_layout(args: argparse.Namespace, budget: int | None) -> dict[str, object]:
    """The actor's micro-batching: padded in one forward/backward, or packed under `budget`."""
    if budget is None:
        return {"ppo_micro_batch_size": args.prompts * args.samples}  # one forward/backward
    return {"use_remove_padding": True, "use_dynamic_bsz": True, "max_token_len_per_gpu": budget}


def ascent_spec(model_dir: Path, out: Path, args: argparse.Namespace,
                budget: int | None = None) -> RunSpec:
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
            "loss_agg_mode": "token-mean", "use_kl_loss": False,
            **ascent_layout(args, budget),
        },
        "reference": {"enable": False},
        "reward": {"functions": [{"name": "exact_match"}]},
        "trainer": {
            "total_steps": 1000, "output_dir": str(out), "resume_mode": "disable", "logger": [],
        },
    })


class RecordingTrainer(RLTrainer):
    """`RLTrainer` that keeps each rollout's response lengths (tokens, eos included)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lengths: list[list[int]] = []

    def generate_batch(self, timer):
        batch, metrics, columns = super().generate_batch(timer)
        self.lengths.append(batch.response_lengths.tolist())
        return batch, metrics, columns


def trl_reward(lengths: list[list[int]]):
    """The project's `exact_match` in TRL's reward signature (`answer` is the dataset column);
    appends each batch's completion lengths in tokens (eos included) to `lengths`."""

    def exact_match_reward(completions, answer, completion_ids, **_) -> list[float]:
        lengths.append([len(ids) for ids in completion_ids])
        return [exact_match(completion, truth) for completion, truth in zip(completions, answer)]

    return exact_match_reward


def trl_config(out: Path, args: argparse.Namespace, steps: int) -> GRPOConfig:
    return GRPOConfig(
        output_dir=str(out), seed=SEED, use_cpu=True, bf16=False, **{CHECKPOINTING: False},
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


@dataclass
class Results:
    """What one run measured; the lists hold every step, the warm-up pairs first."""

    alternate: Alternate
    trl_lengths: list[list[int]]
    ascent_lengths: list[list[int]]
    shape: str
    parameters: int
    tail: Tail | None
    budget: int | None


def measure(args: argparse.Namespace, size: Size) -> Results:
    """Build one saved model (with its long tail), both trainers on it, and run the pairs."""
    train, _ = synthetic_splits(
        "addition", num_train=NUM_TRAIN, num_val=0, seed=SEED, digits=args.digits
    )
    with tempfile.TemporaryDirectory(prefix="grpo-step-") as tmp:
        root = Path(tmp)
        preset, overrides = size.model
        model, tokenizer = build_tiny(preset, seed=0, **overrides)
        tail = None
        if size.mean_share is not None:
            prompts = [row["prompt"] for row in train[:CALIBRATION_ROWS]]
            tail = calibrate_tail(model, tokenizer, prompts, args.new_tokens, size.mean_share)
        model_dir = write_tiny(model, tokenizer, root / "model")
        spec, budget = ascent_spec(model_dir, root / "ascent", args), None
        if not args.padded:
            prompt_tokens = statistics.mean(len(tokenizer(r["prompt"])["input_ids"]) for r in train)
            response_tokens = mean_length(tail.lengths) if tail else args.new_tokens
            budget = token_budget(args, spec, prompt_tokens, response_tokens)
            spec = ascent_spec(model_dir, root / "ascent", args, budget)
        ascent = RecordingTrainer(spec, tracker=Tracker([]))
        ascent.train_step()  # one-off setup of the first step, not part of a pair
        ascent.lengths.clear()
        alternate, trl_lengths = Alternate(ascent), []
        trainer = GRPOTrainer(
            model=str(model_dir), reward_funcs=trl_reward(trl_lengths),
            args=trl_config(root / "trl", args, args.warmup + args.steps),
            train_dataset=Dataset.from_list(train), callbacks=[alternate],
        )
        trainer.remove_callback(PrinterCallback)  # the end-of-training summary
        trainer.train()
    return Results(
        alternate, trl_lengths, ascent.lengths, describe(model), count_parameters(model), tail,
        budget,
    )


def describe(model) -> str:
    c = model.config
    return (
        f"hidden {c.hidden_size}, {c.num_hidden_layers} layers, {c.num_attention_heads} heads "
        f"({c.num_key_value_heads} kv), intermediate {c.intermediate_size}"
    )


# ------------------------------------------------------------------------------- reporting


def report_times(name: str, times: list[float]) -> None:
    print(
        f"{name:<8}{min(times):>9.3f}{statistics.median(times):>10.3f}{1 / min(times):>9.2f}   "
        f"({', '.join(f'{t:.3f}' for t in times)})"
    )


def sampled_lengths(lengths: list[int], cap: int) -> str:
    p90 = statistics.quantiles(lengths, n=10, method="inclusive")[-1]
    at_cap = sum(n == cap for n in lengths) / len(lengths)
    return (
        f"mean {statistics.mean(lengths):.1f}, p50 {statistics.median(lengths):g}, p90 "
        f"{p90:.1f}, max {max(lengths)}, at the limit {at_cap:.1%} ({len(lengths)} responses)"
    )


def expected_lengths(chances: torch.Tensor) -> str:
    cdf = chances.cumsum(0)

    def quantile(q: float) -> int:
        return int((cdf < q).sum()) + 1

    return (
        f"mean {mean_length(chances):.1f}, p50 {quantile(0.5)}, p90 {quantile(0.9)}, "
        f"at the limit {float(chances[-1]):.1%}"
    )


def report_lengths(args: argparse.Namespace, results: Results) -> None:
    """The response lengths each side sampled in the timed steps (and the calibration's)."""
    skip, cap = args.warmup, args.new_tokens
    tail = results.tail
    if tail is not None:
        hazard, k = tail.hazard, min(16, cap)
        print(
            f"long tail: eos row = {tail.scale:.4f} x the unit mean final hidden state; expected "
            f"over {CALIBRATION_ROWS // 2} sampled rows: {expected_lengths(tail.lengths)}; stop "
            f"chance per token {float(hazard[:k].mean()):.4f} (first {k}) to "
            f"{float(hazard[-k:].mean()):.4f} (last {k})"
        )
    for name, lengths in (("trl", results.trl_lengths), ("ascent", results.ascent_lengths)):
        flat = [n for step in lengths[skip:] for n in step]
        print(f"response tokens {name:<7}{sampled_lengths(flat, cap)}")


def report_floor(size: Size, timed: list[dict[str, float]], parameters: int,
                 peak: float) -> None:
    """Ascent's update beside 6 N x real tokens at the measured peak."""
    updates = [m["timing/update"] for m in timed]
    tokens = [m["perf/total_tokens"] for m in timed]
    floors = [6 * parameters * n / (peak * 1e9) for n in tokens]
    ratio = statistics.median(u / f for u, f in zip(updates, floors))
    aim = f"; aim <= {size.aim_floor:g}x" if size.aim_floor is not None else ""
    print(
        f"ascent update {statistics.median(updates):.3f} s (median) against its compute floor "
        f"{statistics.median(floors):.3f} s (6 N x {statistics.median(tokens):.0f} real tokens "
        f"at {peak:.1f} GFLOP/s): update / floor {ratio:.2f}x (median of the steps{aim})"
    )


def report(args: argparse.Namespace, size: Size, results: Results,
           loads: tuple[float, float], peaks: list[float]) -> None:
    """Print the figures of the timed steps (the warm-up pairs left out)."""
    skip, alternate = args.warmup, results.alternate
    trl_times, ascent_times = alternate.trl_times[skip:], alternate.ascent_times[skip:]
    peak = max(peaks)  # the least disturbed measurement
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"trl {trl.__version__}; {'/'.join(map(str, sorted(alternate.threads)))} threads; "
        f"load average (1 min) {loads[0]:.2f} before, {loads[1]:.2f} after; matmul peak "
        f"{peak:.1f} GFLOP/s (fp32 4096^3 mm, best of " + ", ".join(f"{p:.1f}" for p in peaks)
        + ")"
    )
    print(
        f"model {args.size} ({results.shape}), {results.parameters:,} "
        f"parameters, float32; step: {args.prompts} prompts x {args.samples} samples, up to "
        f"{args.new_tokens} new tokens, {args.digits}-digit addition; {args.steps} timed steps "
        f"after {args.warmup} warm-up"
    )
    if results.budget is None:
        print("ascent layout: padded, one forward/backward of all rows (--padded)")
    else:
        print(
            f"ascent layout: actor.use_remove_padding true, actor.use_dynamic_bsz true, "
            f"actor.max_token_len_per_gpu {results.budget} (about {args.micro_batches} "
            f"micro-batches of the expected real tokens)"
        )
    print(f"{'runner':<8}{'best s':>9}{'median s':>10}{'steps/s':>9}   (steps)")
    report_times("trl", trl_times)
    report_times("ascent", ascent_times)
    paired = statistics.median(t / a for t, a in zip(trl_times, ascent_times))
    print(
        f"trl time / ascent time: {min(trl_times) / min(ascent_times):.2f}x (best steps), "
        f"{statistics.median(trl_times) / statistics.median(ascent_times):.2f}x (medians), "
        f"{paired:.2f}x (median of the per-pair ratios; aim >= {size.aim_ratio:g}x)"
    )
    report_lengths(args, results)
    timed = alternate.ascent_metrics[skip:]
    stages = [k for k in timed[0] if k.startswith("timing/")]  # in the trainer's order
    print("ascent timing/* (median s; nested stages overlap): " + ", ".join(
        f"{k.removeprefix('timing/')} {statistics.median(m.get(k, 0.0) for m in timed):.3f}"
        for k in stages
    ))
    report_floor(size, timed, results.parameters, peak)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=sorted(SIZES), help="model and shape")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--samples", type=int, default=8, help="responses per prompt")
    parser.add_argument("--new-tokens", type=int, help="longest response (default: the size's)")
    parser.add_argument("--digits", type=int, default=2, choices=[2, 3], help="digits per operand")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per trainer")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per trainer first")
    parser.add_argument("--lr", type=float, default=1e-5, help="learning rate of both")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--padded", action="store_true",
                        help="Ascent without remove padding and dynamic batch size")
    parser.add_argument("--micro-batches", type=int,
                        help="Ascent's micro-batches per update, setting its token budget "
                        "(default: the size's)")
    args = parser.parse_args()
    size = SIZES[args.size]
    args.new_tokens = args.new_tokens or size.new_tokens
    args.micro_batches = args.micro_batches or size.micro_batches
    if args.threads:
        torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    load_before = os.getloadavg()[0]
    peaks = [matmul_peak()[0]]
    results = measure(args, size)
    peaks.append(matmul_peak()[0])
    report(args, size, results, (load_before, os.getloadavg()[0]), peaks)


if __name__ == "__main__":
    main()
