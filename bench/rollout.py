"""Rollout throughput: the native engine against transformers' `model.generate`, same run.

    python bench/rollout.py [--sizes small,30m] [--batch 64] [--new-tokens 128] \
        [--prompt-len 32] [--repeats 3] [--device cpu] [--dtype float32] [--threads N] [--no-bf16]

For each size a tiny Qwen2 model is built (seeded), the generators are warmed up, then timed
`--repeats` times, alternating, on the same left-padded prompts (random bytes, lengths between
half of and the full `--prompt-len`), sampling at temperature 1 with no top-k/top-p/min-p. Eos
is disabled, so each call produces exactly batch x new-tokens tokens. Generators: `hf`
(transformers' generate), `native` (the engine, in the model's dtype) and, for a float32 model,
`native-bf16` (the engine computing in bfloat16 from the float32 weights; skip with
--no-bf16). Sizes: nano, small, base (the presets) and 30m (hidden 512, 8 layers, 8 heads,
4 kv heads, intermediate 2048).

Prints tokens per second, best and median over the repeats, and the ratio of the bests to
`hf`: the best run is the one least disturbed by other work on the machine. On a shared
machine compare `--threads 1` figures: two threads contending with other processes for two
cores slow down erratically. Figures only: nothing here passes or fails on time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import GenerationConfig  # noqa: E402

from rl_core.engines.rollout import NativeRolloutEngine, SamplingParams  # noqa: E402
from rl_core.models.tiny import build_tiny, count_parameters  # noqa: E402

SIZES = {
    "nano": ("nano", {}),
    "small": ("small", {}),
    "base": ("base", {}),
    "30m": (
        "small",
        {
            "hidden_size": 512,
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "intermediate_size": 2048,
        },
    ),
}


def make_prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max(1, length // 2), length + 1, (batch,), generator=g)
    return [torch.randint(0, 256, (int(n),), generator=g).tolist() for n in lengths]


def hf_runner(model, prompts, engine, new_tokens, device):
    batch = engine.generate(prompts, SamplingParams(max_new_tokens=1))  # left padding only
    ids, mask = batch.prompt_ids.to(device), batch.prompt_mask.to(device)
    config = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
        max_new_tokens=new_tokens, min_new_tokens=new_tokens,
        pad_token_id=engine.pad_token_id, eos_token_id=None,
    )

    def run(seed: int) -> int:
        torch.manual_seed(seed)
        out = model.generate(ids, attention_mask=mask, generation_config=config)
        return (out.shape[1] - ids.shape[1]) * out.shape[0]

    return run


def native_runner(engine, prompts, new_tokens):
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    engine.free_cache()  # each engine allocates its own

    def run(seed: int) -> int:
        batch = engine.generate(prompts, params, torch.Generator().manual_seed(seed))
        return int(batch.response_mask.sum())

    return run


def timed(run, seed: int) -> float:
    start = time.perf_counter()
    tokens = run(seed)
    return tokens / (time.perf_counter() - start)


def bench_size(name: str, args: argparse.Namespace) -> None:
    preset, overrides = SIZES[name]
    model, tokenizer = build_tiny(preset, 0, **overrides)
    model.to(device=args.device, dtype=getattr(torch, args.dtype))
    vocab = model.config.vocab_size
    # An eos id outside the vocabulary never comes up: every row runs to new-tokens.
    engine = NativeRolloutEngine(model, [vocab], tokenizer.pad_token_id, device=args.device)
    prompts = make_prompts(args.batch, args.prompt_len, seed=1)
    runs = {
        "hf": hf_runner(model, prompts, engine, args.new_tokens, args.device),
        "native": native_runner(engine, prompts, args.new_tokens),
    }
    if args.bf16 and args.dtype == "float32":
        bf16 = NativeRolloutEngine(
            model, [vocab], tokenizer.pad_token_id, device=args.device, dtype=torch.bfloat16
        )
        runs["native-bf16"] = native_runner(bf16, prompts, args.new_tokens)
    for run in runs.values():  # warm-up: allocator, thread pool, kernels
        timed(run, 0)
    rates: dict[str, list[float]] = {key: [] for key in runs}
    for repeat in range(args.repeats):
        for key, run in runs.items():
            rates[key].append(timed(run, repeat + 1))
    best = {key: max(values) for key, values in rates.items()}
    print(f"{name}: {count_parameters(model):,} parameters", flush=True)
    for key, rate in best.items():
        print(
            f"  {key:12s} best {rate:9,.0f} tok/s  {rate / best['hf']:5.2f}x hf   "
            f"median {statistics.median(rates[key]):9,.0f}  "
            f"(runs: {', '.join(f'{r:,.0f}' for r in rates[key])})",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="small,30m", help=f"comma list of {', '.join(SIZES)}")
    parser.add_argument("--batch", type=int, default=64, help="prompts per call")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens per response")
    parser.add_argument("--prompt-len", type=int, default=32, help="longest prompt")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per generator")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument(
        "--no-bf16", dest="bf16", action="store_false",
        help="skip the native engine computing in bfloat16 from the float32 weights",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {', '.join(unknown)}; choose from {', '.join(SIZES)}")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, device {args.device}, "
        f"{args.dtype}; batch {args.batch} x {args.new_tokens} new tokens, "
        f"prompts up to {args.prompt_len} tokens",
        flush=True,
    )
    for name in sizes:
        bench_size(name, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
