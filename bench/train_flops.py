"""Training throughput and FLOP utilisation: the train engine against a plain PyTorch loop.

    python bench/train_flops.py [--size 30m] [--batch 8] [--seq-len 512] [--micro 2,8] \
        [--repeats 3] [--threads N] [--compile-layers]

Measures this machine's float32 matmul peak (a 4096 x 4096 torch.mm, best of 10 after warmup,
before the runs and after each micro-batch size; the highest is used),
builds one seeded tiny Qwen2 model (30m: hidden 512, 8 layers, 8 heads, 4 kv heads,
intermediate 2048, vocabulary 263, about 31.6M parameters) and times, on copies of it and the
same random batch of `--batch` x `--seq-len` tokens, one optimizer step of

- baseline: the plain loop: Hugging Face forward over every position, cross-entropy of the next
  token, backward per micro-batch (loss scaled by 1/micro-batches), clip_grad_norm_, AdamW
  with torch's defaults (for-loop update on CPU), zero_grad;
- engine: `TrainEngine.train_step` with `sft_loss_fn` on a response of seq-len - 1 tokens (the
  same tokens the baseline's cross-entropy covers), AdamW fused.

The two runners alternate, `--repeats` timed steps each after one warmup step, per micro-batch
size. Model FLOPs per step (PaLM appendix B, as nanoGPT's MFU):

    tokens x (6 N + 12 L d T)

N parameters (tied embeddings once: the LM head is a matmul over them), L layers, d = heads x
head size, T the sequence length; 6N is forward (2N) plus backward (4N) of every weight matmul,
12 L d T the attention score and value matmuls (forward and backward, counted without causal
savings). Reported: tokens/s, achieved GFLOP/s and its fraction of the measured peak, from the
best step and from the median, and the ratio engine / baseline. Other processes on the machine
show up as slow repeats: the best step is the figure that survives them. `--compile-layers`
also runs the engine with each decoder layer wrapped by torch.compile. Figures only: nothing
here passes or fails on time.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_core.engines.train import TrainEngine, sft_loss_fn  # noqa: E402
from rl_core.models.tiny import build_tiny, count_parameters  # noqa: E402

SIZES = {
    "small": ("small", {}),
    "base": ("base", {}),
    "30m": (
        "base",
        {
            "hidden_size": 512,
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "intermediate_size": 2048,
        },
    ),
}
LR = 1e-4


def matmul_peak(n: int = 4096, repeats: int = 10) -> tuple[float, float]:
    """Best and median float32 GFLOP/s of an n x n x n torch.mm."""
    a, b, out = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    for _ in range(3):
        torch.mm(a, b, out=out)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        rates.append(2 * n**3 / (time.perf_counter() - start) / 1e9)
    return max(rates), statistics.median(rates)


def step_flops(model: torch.nn.Module, batch: int, seq_len: int) -> float:
    config = model.config
    attn_width = config.num_attention_heads * (config.hidden_size // config.num_attention_heads)
    per_token = 6 * count_parameters(model) + 12 * config.num_hidden_layers * attn_width * seq_len
    return batch * seq_len * per_token


def make_batch(batch: int, seq_len: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=g)
    mask = torch.ones_like(ids)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": torch.arange(seq_len).expand(batch, seq_len),
        "response_mask": mask[:, 1:],
    }


def baseline_runner(model: torch.nn.Module, data: dict[str, torch.Tensor], micro: int):
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    rows = data["input_ids"].shape[0]

    def step() -> None:
        for i in range(0, rows, micro):
            ids = data["input_ids"][i : i + micro]
            mask = data["attention_mask"][i : i + micro]
            logits = model(input_ids=ids, attention_mask=mask).logits
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
            (loss * ids.shape[0] / rows).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()

    return step


def engine_runner(model: torch.nn.Module, data: dict[str, torch.Tensor], micro: int):
    engine = TrainEngine(model, lr=LR, grad_clip=1.0)
    return lambda: engine.train_step(data, sft_loss_fn, micro_batch_size=micro)


def compiled_engine_runner(model: torch.nn.Module, data: dict[str, torch.Tensor], micro: int):
    for layer in model.model.layers:
        layer.compile()
    return engine_runner(model, data, micro)


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def run_micro(model, data, micro, runners, repeats) -> dict[str, list[float]]:
    """Step times per runner for one micro-batch size: a warmup each, then alternating."""
    steps = {name: make(copy.deepcopy(model), data, micro) for name, make in runners.items()}
    for step in steps.values():
        step()  # warmup (and compilation)
    times = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            times[name].append(timed(step))
    return times


def report(micro, times, flops, tokens, peak) -> None:
    best = {name: min(ts) for name, ts in times.items()}
    for name, ts in times.items():
        median = statistics.median(ts)
        print(
            f"{name:<16}{micro:>6}{best[name]:>9.2f}{median:>10.2f}"
            f"{tokens / best[name]:>8.0f}{flops / best[name] / 1e9:>9.1f}"
            f"{100 * flops / best[name] / 1e9 / peak:>7.1f}%"
            f"{100 * flops / median / 1e9 / peak:>16.1f}%"
        )
    for name in best:
        if name != "baseline":
            ratio = best["baseline"] / best[name]
            print(f"{'':<16}{micro:>6}  {name} / baseline: {ratio:.2f}x (best steps)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="30m", choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--micro", default="2,8", help="micro-batch sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--compile-layers", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    peaks = [matmul_peak()]
    preset, overrides = SIZES[args.size]
    model, _ = build_tiny(preset, seed=0, max_position_embeddings=args.seq_len, **overrides)
    flops = step_flops(model, args.batch, args.seq_len)
    tokens = args.batch * args.seq_len
    data = make_batch(args.batch, args.seq_len, model.config.vocab_size)
    runners = {"baseline": baseline_runner, "engine": engine_runner}
    if args.compile_layers:
        runners["engine+compile"] = compiled_engine_runner
    results = {}
    for micro in (int(m) for m in args.micro.split(",")):
        results[micro] = run_micro(model, data, micro, runners, args.repeats)
        peaks.append(matmul_peak())
    peak = max(best for best, _ in peaks)  # the least disturbed measurement

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"matmul peak: {peak:.1f} GFLOP/s (fp32 4096^3 mm, best of {len(peaks)} measurements: "
        + ", ".join(f"{best:.1f}" for best, _ in peaks) + ")"
    )
    print(
        f"model {args.size}: {count_parameters(model):,} parameters; step: {args.batch} x "
        f"{args.seq_len} tokens, {flops / 1e9:.1f} GFLOP (6N + 12LdT per token)"
    )
    print(
        f"{'runner':<16}{'micro':>6}{'best s':>9}{'median s':>10}{'tok/s':>8}"
        f"{'GFLOP/s':>9}{'% peak':>8}{'% peak (median)':>17}"
    )
    for micro, times in results.items():
        report(micro, times, flops, tokens, peak)


if __name__ == "__main__":
    main()
