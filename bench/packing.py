"""Padded against packed training on long-tail response lengths: tokens/s and the ideal speed-up.

    python bench/packing.py [--size base] [--rows 32] [--max-response 512] [--micro 4] \
        [--budget 2048] [--steps 3] [--threads N]

One seeded tiny Qwen2 (`--size`: small, base or 30m, as bench/train_flops.py) and one batch of
`--rows` rows laid out as the rollout does (prompts of 8-32 tokens left-padded, responses
right-padded to `--max-response`), with response lengths from a long tail: a Pareto(1.2) draw
scaled so most answers are short and a few reach the cap, as long chains of thought do. Each
runner takes `--steps` timed optimizer steps (`TrainEngine.train_step`, `sft_loss_fn`) after one
warmup step, on copies of the model, alternating so both see the same load:

- padded: `--micro` rows per micro-batch; each micro-batch already drops its all-padding
  columns, so it computes rows x (its longest row) positions;
- padded+kk: the same rows by a token budget (`--budget`, Karmarkar–Karp micro-batches), padded;
- packed: remove padding (`remove_padding`: each micro-batch's rows as one sequence of its real
  tokens, block-diagonal causal attention) under the same token budget.

Ideal speed-up of packing: the positions the padded runner computes over the real tokens (what
the arithmetic would shrink by if only real tokens cost). Reported: real and computed tokens,
median step seconds, real tokens/s, the speed-up over padded and speed-up / ideal. The
packed sequence's attention runs over all of its N tokens with a mask (sdpa on the CPU has no
variable-length kernel), so its attention arithmetic grows with N², not the rows' sum of
squares: a smaller budget wastes less there, a larger one gives bigger matmuls. Figures only:
nothing here passes or fails on time.
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_core.engines.balance import token_micro_batches  # noqa: E402
from rl_core.engines.train import TrainEngine, sft_loss_fn, split_rows  # noqa: E402
from rl_core.models.tiny import build_tiny, count_parameters  # noqa: E402

SIZES = {
    "small": ("small", {}),
    "base": ("base", {}),
    "30m": ("base", {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8,
                     "num_key_value_heads": 4, "intermediate_size": 2048}),
}


def long_tail(n: int, cap: int, seed: int = 0) -> list[int]:
    """Response lengths in [4, cap]: most short, a tail to the cap."""
    rng = random.Random(seed)
    return [int(min(cap, 4 + (rng.paretovariate(1.2) - 1) * cap / 10)) for _ in range(n)]


def make_batch(rows: int, max_response: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(8, 33, (rows,), generator=g).tolist()
    responses = long_tail(rows, max_response)
    width = 32 + max_response
    ids = torch.randint(0, vocab, (rows, width), generator=g)
    mask = torch.zeros(rows, width, dtype=torch.long)
    for row, (p, r) in enumerate(zip(prompts, responses)):
        mask[row, 32 - p:32 + r] = 1
    return {"input_ids": ids, "attention_mask": mask,
            "position_ids": (mask.cumsum(1) - 1).clamp(min=0), "response_mask": mask[:, 32:]}


def computed_positions(mask: torch.Tensor, groups: list[list[int]]) -> int:
    """Positions a padded runner computes: per micro-batch, rows x its trimmed width."""
    total = 0
    for rows in groups:
        sub = mask[rows].bool()
        cols = sub.any(0).nonzero()
        total += len(rows) * int(cols.max() - cols.min() + 1)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="base", choices=list(SIZES))
    parser.add_argument("--rows", type=int, default=32, help="rows of the batch")
    parser.add_argument("--max-response", type=int, default=512, help="longest response")
    parser.add_argument("--micro", type=int, default=4, help="rows per padded micro-batch")
    parser.add_argument("--budget", type=int, default=2048, help="tokens per budget micro-batch")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per runner")
    parser.add_argument("--threads", type=int, help="torch intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    preset, overrides = SIZES[args.size]
    model, _ = build_tiny(preset, seed=0, **overrides)
    data = make_batch(args.rows, args.max_response, model.config.vocab_size)
    mask = data["attention_mask"]
    real = int(mask.sum())
    lengths = mask.sum(1).tolist()
    padded_positions = computed_positions(mask, split_rows(args.rows, args.micro))
    kk_positions = computed_positions(mask, token_micro_batches(lengths, args.budget))
    runners = {
        "padded": (TrainEngine(copy.deepcopy(model), lr=1e-5, micro_batch_size=args.micro),
                   padded_positions),
        "padded+kk": (TrainEngine(copy.deepcopy(model), lr=1e-5, max_token_len=args.budget),
                      kk_positions),
        "packed": (TrainEngine(copy.deepcopy(model), lr=1e-5, max_token_len=args.budget,
                               remove_padding=True), real),
    }
    times: dict[str, list[float]] = {name: [] for name in runners}
    for repeat in range(args.steps + 1):
        for name, (engine, _) in runners.items():
            start = time.perf_counter()
            engine.train_step(data, sft_loss_fn)
            if repeat:  # the first is warmup
                times[name].append(time.perf_counter() - start)
    print(f"model {args.size}: {count_parameters(model) / 1e6:.2f}M parameters; "
          f"{args.rows} rows, responses up to {args.max_response} (long tail: mean "
          f"{statistics.mean(long_tail(args.rows, args.max_response)):.0f}), "
          f"torch threads {torch.get_num_threads()}, load {os.getloadavg()[0]:.2f}")
    print(f"real tokens {real}; full width {mask.numel()}; micro-batches of {args.micro} rows "
          f"compute {padded_positions}; budget {args.budget}: "
          f"{len(token_micro_batches(lengths, args.budget))} micro-batches")
    base = statistics.median(times["padded"])
    ideal = padded_positions / real
    print(f"{'runner':<11}{'positions':>10}{'median s':>10}{'real tok/s':>12}{'speed-up':>10}"
          f"{'of ideal':>10}")
    for name, (_, positions) in runners.items():
        median = statistics.median(times[name])
        speedup = base / median
        share = speedup / ideal
        print(f"{name:<11}{positions:>10}{median:>10.3f}{real / median:>12,.0f}{speedup:>10.2f}"
              f"{share:>10.0%}")
    print(f"ideal speed-up (padded positions / real tokens): {ideal:.2f}")


if __name__ == "__main__":
    main()
