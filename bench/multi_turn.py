"""Multi-turn rollout tokens/s against single-turn at the same total length.

    python bench/multi_turn.py [--model DIR] [--prompts 16] [--n 4] [--new-tokens 160] \
        [--repeats 3] [--threads N]

The model is the calculator base (`--model`, default tests/training/golden/calculator: the
tiny model after an SFT on `calculator_transcripts`), which calls the calculator on two-digit
products. On the same prompts (`--prompts` problems, `--n` samples each, temperature 1,
seeded):

- `multi-turn`: `MultiTurn.generate` over the native engine with the calculator on offer
  (`rollout.multi_turn` with max_turns 2): the first turn of every sample in one call, the
  tool's answers appended as tokens, the second turn of those that called in a second call
  (its prompts the whole sequence so far, prefilled again).
- `single-turn`: one call of the same prompts with eos disabled and `max_new_tokens` set to the
  multi-turn responses' mean total length (model and tool tokens), so both produce about as
  many response tokens.

Prints per mode: seconds per rollout (median), response tokens (the model's; the tools' for
multi-turn), tokens/s of all response tokens and of the model's, and multi/single. What the
turns should cost: one more prefill of each calling row's whole context (prompt, first turn,
answer: about 150 tokens here) and the tool calls (the calculator: well under a millisecond
each, in threads); on a CPU a decode step costs about in proportion to the rows still running,
so the second call, with only the calling rows, decodes as cheaply as the tail of one long call.
Figures only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rl_core.data.synthetic import arithmetic_problems  # noqa: E402
from rl_core.data.templates import render_prompt  # noqa: E402
from rl_core.models.loading import load_model, load_tokenizer  # noqa: E402
from rl_core.rollout.native import NativeRolloutEngine, eos_ids  # noqa: E402
from rl_core.rollout.sampling import SamplingParams  # noqa: E402
from rl_core.rollout.turns import MultiTurn  # noqa: E402
from rl_core.tools import get_tool  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(ROOT / "tests/training/golden/calculator"))
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model).eval()
    eos = eos_ids(tokenizer, model)
    engine = NativeRolloutEngine(model, eos, tokenizer.pad_token_id)
    prompts = [tokenizer.encode(render_prompt(p["prompt"], "chat", tokenizer),
                                add_special_tokens=False)
               for p in arithmetic_problems("*", args.prompts, seed=5, digits=2)]
    turns = MultiTurn(tokenizer, {"calculator": get_tool("calculator")}, max_turns=2)
    params = SamplingParams(n=args.n, max_new_tokens=args.new_tokens)

    def rolled(ids, piece, seed):
        return engine.generate(ids, piece, torch.Generator().manual_seed(seed))

    multi_times, lengths, model_tokens, calls = [], 0.0, 0, 0
    for repeat in range(args.repeats):
        started = time.perf_counter()
        batch = turns.generate(rolled, prompts, params, seed=repeat)
        multi_times.append(time.perf_counter() - started)
        lengths = float(batch.response_lengths.float().mean())
        tools = int((batch["tool_mask"] * batch.response_mask).sum())
        total = int(batch.response_mask.sum())
        model_tokens, calls = total - tools, int(batch["tool_calls"].sum())
    single_engine = NativeRolloutEngine(model, [-1], tokenizer.pad_token_id)  # eos disabled
    same = SamplingParams(n=args.n, max_new_tokens=max(1, round(lengths)))
    single_times = []
    for repeat in range(args.repeats):
        started = time.perf_counter()
        single = single_engine.generate(prompts, same, torch.Generator().manual_seed(repeat))
        single_times.append(time.perf_counter() - started)
    single_tokens = int(single.response_mask.sum())
    multi_s, single_s = statistics.median(multi_times), statistics.median(single_times)
    print(f"model {args.model}, {args.prompts} prompts x {args.n} samples, "
          f"{torch.get_num_threads()} threads")
    print(f"{'mode':<12} {'s/rollout':>10} {'tokens':>8} {'tools':>7} {'tok/s':>9} "
          f"{'model tok/s':>12}")
    print(f"{'multi-turn':<12} {multi_s:>10.2f} {total:>8} {tools:>7} {total / multi_s:>9.0f} "
          f"{model_tokens / multi_s:>12.0f}   ({calls} calls, mean length {lengths:.0f})")
    print(f"{'single-turn':<12} {single_s:>10.2f} {single_tokens:>8} {0:>7} "
          f"{single_tokens / single_s:>9.0f} {single_tokens / single_s:>12.0f}")
    print(f"multi/single tokens/s: {(total / multi_s) / (single_tokens / single_s):.2f}")


if __name__ == "__main__":
    main()
