"""LoRA (`actor.lora`) against full fine-tuning: training-state memory and step time.

    python bench/lora.py [--params 30m|300m|500m] [--rank 16] [--steps 3] [--rows 8] [--seq 128] \
        [--threads N]
    python bench/lora.py --device cuda --params 500m --dtype bfloat16     # on a GPU

Builds a Qwen2-shaped model (random weights, the byte vocabulary; `bench/fsdp.py`'s shapes) and
takes `--steps` AdamW steps of a PPO-clip loss on `--rows` rows of `--seq` tokens (half prompt,
half response) with the plain engine (`actor.strategy: torch`): once training every weight, once
with LoRA adapters of `--rank` (alpha 2·rank) on the attention and MLP projections. Each
configuration runs in a fresh process, so their peaks do not mix.

Printed per configuration: the trained parameters, the training state counted from the tensors
— parameters (the frozen base included), gradients as they are when the optimizer steps, AdamW
moments and float32 master weights (exact) — the process's peak resident set (CPU) or peak
device memory (CUDA), the median step time and the seconds to produce the rollout's weights
bucket by bucket (`weight_buckets`: LoRA merges W + (alpha / rank) · B A there). Ratio lines:
LoRA over full fine-tuning for the training state and the step time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.multiprocessing as mp
from fsdp import SHAPES, batch, build, local_bytes, loss_fn, peak_memory


def run(rank: int, lora_rank: int, args, out: str) -> None:
    from rl_core.engines.train import TrainEngine
    from rl_core.spec import LoraConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    lora = LoraConfig(rank=lora_rank, alpha=2.0 * lora_rank) if lora_rank else None
    engine = TrainEngine(build(args.params), lr=1e-5, micro_batch_size=args.micro,
                         total_steps=args.steps, param_dtype=args.dtype, device=device, lora=lora)
    data = batch(args.rows, args.seq)
    grads = [0]
    engine.optimizer.register_step_pre_hook(  # the gradients exist only until the step
        lambda opt, *_: grads.__setitem__(0, local_bytes(
            p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None)))
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        engine.train_step(data, loss_fn)
        times.append(time.perf_counter() - start)
    moments = [v for state in engine.optimizer.state.values() for k, v in state.items()
               if k in ("exp_avg", "exp_avg_sq")]
    state = {"parameters": local_bytes(engine.model.parameters()), "gradients": grads[0],
             "moments": local_bytes(moments), "masters": local_bytes(engine.masters)}
    start = time.perf_counter()
    for _bucket in engine.weight_buckets(bucket_bytes=256 << 20):
        pass
    sync = time.perf_counter() - start
    torch.save({"state": state, "trained": sum(p.numel() for p in engine.params),
                "peak": peak_memory(device), "step_s": statistics.median(times),
                "sync_s": sync}, out)


def measure(lora_rank: int, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-lora-") as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.spawn(run, args=(lora_rank, args, out), nprocs=1, join=True)
        return torch.load(out, weights_only=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", choices=sorted(SHAPES), default="30m")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: its default)")
    args = parser.parse_args()
    params = sum(p.numel() for p in build(args.params).parameters())
    print(f"{args.params}: {params / 1e6:.1f}M parameters, {args.dtype}, {args.rows} rows x "
          f"{args.seq} tokens, {args.steps} steps, device {args.device}, "
          f"{args.threads or torch.get_num_threads()} threads, torch {torch.__version__}")
    rows = [("full", 0), (f"lora r={args.rank}", args.rank)]
    results = {name: measure(rank, args) for name, rank in rows}
    mib = 2**20
    print(f"{'training':<12} {'trained M':>9} {'params MiB':>10} {'grads MiB':>9} "
          f"{'moments MiB':>11} {'masters MiB':>11} {'state MiB':>9} {'peak MiB':>8} "
          f"{'step s':>7} {'sync s':>7}")
    for name, _ in rows:
        r, state = results[name], results[name]["state"]
        print(f"{name:<12} {r['trained'] / 1e6:>9.2f} {state['parameters'] / mib:>10.1f} "
              f"{state['gradients'] / mib:>9.1f} {state['moments'] / mib:>11.1f} "
              f"{state['masters'] / mib:>11.1f} {sum(state.values()) / mib:>9.1f} "
              f"{r['peak'] / mib:>8.0f} {r['step_s']:>7.2f} {r['sync_s']:>7.3f}")
    full, lora = results["full"], results[rows[1][0]]
    ratio = sum(lora["state"].values()) / sum(full["state"].values())
    print(f"training state, LoRA / full: {ratio:.3f}x; step time, LoRA / full: "
          f"{lora['step_s'] / full['step_s']:.2f}x")


if __name__ == "__main__":
    main()
