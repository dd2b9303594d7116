"""Rollout throughput: the native and vLLM engines against transformers' `model.generate`.

    python bench/rollout.py [--sizes small,30m] [--batch 64] [--new-tokens 128] \
        [--prompt-len 32] [--repeats 3] [--device cpu] [--dtype float32] [--threads N] \
        [--no-bf16] [--no-vllm]

For each size a tiny Qwen2 model is built (seeded), the generators are warmed up, then timed
`--repeats` times, alternating, on the same left-padded prompts (random bytes, lengths between
half of and the full `--prompt-len`), sampling at temperature 1 with no top-k/top-p/min-p. Eos
is disabled, so each call produces exactly batch x new-tokens tokens. Generators: `hf`
(transformers' generate), `native` (the engine, in the model's dtype), for a float32 model
`native-bf16` (the engine computing in bfloat16 from the float32 weights; skip with
--no-bf16), and `vllm` (`VLLMRolloutEngine`: an in-process `vllm.LLM` on the model saved to a
temporary folder, its weights synced from the torch model as training syncs them; skip with
--no-vllm; skipped with a note where vLLM is not installed). Sizes: nano, small, base (the
presets) and 30m (hidden 512, 8 layers, 8 heads, 4 kv heads, intermediate 2048).

Prints tokens per second, best and median over the repeats, and the ratio of the bests to
`hf`: the best run is the one least disturbed by other work on the machine. For vLLM it also
prints the seconds of a weight sync (`load_weights` from the model's state dict), one per
repeat. On a shared machine compare `--threads 1` figures: two threads contending with other
processes for two cores slow down erratically. Figures only: nothing here passes or fails on
time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its start-up log would bury the figures

from transformers import GenerationConfig  # noqa: E402

from rl_core.errors import InputError  # noqa: E402
from rl_core.models.tiny import build_tiny, count_parameters, write_tiny  # noqa: E402
from rl_core.rollout.native import NativeRolloutEngine  # noqa: E402
from rl_core.rollout.sampling import SamplingParams  # noqa: E402
from rl_core.rollout.vllm import INSTALL_HINT, vllm_available  # noqa: E402

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


def vllm_engine(model, tokenizer, folder: Path, args: argparse.Namespace):
    """A vLLM engine for `model`, saved to `folder`, that stops only at max_new_tokens.

    vLLM rejects stop ids outside the vocabulary and adds the folder's generation-config eos ids
    to every request's stop ids, so the folder is saved without eos ids and the engine's stop ids
    are emptied after it is built (its constructor insists on at least one).
    """
    from rl_core.rollout.vllm import VLLMRolloutEngine

    configured = model.generation_config
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id)
    try:
        write_tiny(model, tokenizer, folder)
    finally:
        model.generation_config = configured
    engine = VLLMRolloutEngine(
        str(folder), eos_token_ids=[tokenizer.eos_token_id], pad_token_id=tokenizer.pad_token_id,
        device=args.device, dtype=getattr(torch, args.dtype),
        max_model_len=args.prompt_len + args.new_tokens,
    )
    engine.eos_token_ids = []
    return engine


def sync_weights(engine, model, version: int) -> float:
    """Seconds of one weight sync from the model's state dict (one bucket, as a training
    engine on one rank streams it)."""
    start = time.perf_counter()
    engine.load_weights([list(model.state_dict().items())], version=version)
    return time.perf_counter() - start


def vllm_runner(engine, prompts, new_tokens):
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)

    def run(seed: int) -> int:
        batch = engine.generate(prompts, params, torch.Generator().manual_seed(seed))
        short = int((batch.response_lengths < new_tokens).sum())
        if short:
            print(f"  warning: vllm stopped {short} of {len(prompts)} rows before {new_tokens} "
                  "tokens; its figure is for a smaller workload", flush=True)
        return int(batch.response_mask.sum())

    return run


def timed(run, seed: int) -> float:
    start = time.perf_counter()
    tokens = run(seed)
    return tokens / (time.perf_counter() - start)


def bench_size(name: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix=f"bench-rollout-{name}-") as scratch:
        bench_model(name, Path(scratch) / "model", args)


def bench_model(name: str, folder: Path, args: argparse.Namespace) -> None:
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
    vllm, skipped = None, None
    if args.vllm and vllm_available():
        try:  # e.g. a head size vLLM's CPU attention has no kernel for (the nano preset's 8)
            vllm = vllm_engine(model, tokenizer, folder, args)
        except InputError as exc:
            skipped = str(exc)
    if vllm is not None:
        sync_weights(vllm, model, version=0)  # before the first rollout, as the actor does
        runs["vllm"] = vllm_runner(vllm, prompts, args.new_tokens)
    for run in runs.values():  # warm-up: allocator, thread pool, kernels
        timed(run, 0)
    rates: dict[str, list[float]] = {key: [] for key in runs}
    syncs: list[float] = []
    for repeat in range(args.repeats):
        for key, run in runs.items():
            rates[key].append(timed(run, repeat + 1))
        if vllm is not None:
            syncs.append(sync_weights(vllm, model, version=repeat + 1))
    if vllm is not None:
        vllm.close()  # its KV cache and process group, before the next size builds its own
    best = {key: max(values) for key, values in rates.items()}
    print(f"{name}: {count_parameters(model):,} parameters", flush=True)
    if skipped:
        print(f"  vllm: skipped, {skipped}", flush=True)
    for key, rate in best.items():
        print(
            f"  {key:12s} best {rate:9,.0f} tok/s  {rate / best['hf']:5.2f}x hf   "
            f"median {statistics.median(rates[key]):9,.0f}  "
            f"(runs: {', '.join(f'{r:,.0f}' for r in rates[key])})",
            flush=True,
        )
    if syncs:
        print(
            f"  {'vllm sync':12s} best {min(syncs):9.3f} s       "
            f"median {statistics.median(syncs):9.3f} s  "
            f"(runs: {', '.join(f'{s:.3f}' for s in syncs)})",
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
    parser.add_argument(
        "--no-vllm", dest="vllm", action="store_false", help="skip the vLLM rollout engine"
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
    if args.vllm and not vllm_available():
        print(f"vllm: skipped, vLLM is not importable here; to include it, {INSTALL_HINT}",
              flush=True)
        args.vllm = False
    for name in sizes:
        bench_size(name, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
