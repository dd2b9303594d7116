"""FSDP2 against the plain engine: training-state memory per rank, step time, weight-sync time.

    python bench/fsdp.py [--params 300m|30m] [--ranks 2] [--steps 3] [--rows 8] [--seq 128]
    python bench/fsdp.py --device cuda --params 500m --dtype bfloat16 --ranks 1   # on a GPU

Builds a Qwen2-shaped model (random weights, the byte vocabulary) and takes `--steps` AdamW steps
of a PPO-clip loss on `--rows` rows of `--seq` tokens (half prompt, half response) per step:
once with the plain engine on one rank (`actor.strategy: torch`), once with `FSDP2Engine` over
`--ranks` ranks (gloo on CPU, nccl on CUDA), each rank taking its share of the rows. Every
configuration runs in fresh processes, so their peaks do not mix.

Printed per configuration (rank 0): the training state per rank counted from the tensors —
parameters, gradients and AdamW moments, local shards only (exact, what the aim is about) —
the process's peak resident set (CPU) or peak device memory (CUDA), the median step time, and
the seconds to gather the full weights bucket by bucket (`weight_buckets`, what a weight sync
costs before the rollout copies them). The ratio line compares the sharded training state with
the plain one; the aim at 2 ranks is at most 0.55x (half, plus what FSDP2 keeps unsharded).
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
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {  # hidden, layers, heads, kv heads, intermediate
    "30m": (512, 8, 8, 2, 1408),
    "300m": (1024, 24, 16, 4, 2816),
    "500m": (896, 24, 14, 2, 4864),  # Qwen2.5-0.5B's layout on the byte vocabulary
}


def build(shape: str) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rl_core.models.tokenizer import build_tiny_tokenizer

    hidden, layers, heads, kv, inter = SHAPES[shape]
    vocab = len(build_tiny_tokenizer())
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
                         max_position_embeddings=4096, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config)


def batch(rows: int, seq: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    response = seq // 2
    ids = torch.randint(0, 256, (rows, seq), generator=g)
    mask = torch.ones_like(ids)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1,
            "response_mask": mask[:, -response:].float(),
            "old_logprobs": torch.full((rows, response), -5.5),
            "advantages": torch.randn(rows, 1, generator=g).expand(rows, response).clone()}


def loss_fn(micro, logprobs, _entropy):
    from rl_core import algos

    loss, metrics = algos.get_policy_loss("vanilla")(
        micro["old_logprobs"], logprobs, micro["advantages"], micro["response_mask"],
        loss_agg_mode="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2)
    return loss, {"actor/pg_loss": loss.detach()}


def local_bytes(tensors) -> int:
    """Bytes of these tensors held by this rank (a DTensor's local shard)."""
    total = 0
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def optimizer_of(engine) -> torch.optim.Optimizer:
    return engine.inner.optimizer if hasattr(engine, "inner") else engine.optimizer


def training_state(engine, gradient_bytes: int) -> dict[str, int]:
    """Parameters and AdamW moments now; gradients as they were when the optimizer stepped."""
    moments = [v for state in optimizer_of(engine).state.values() for k, v in state.items()
               if k in ("exp_avg", "exp_avg_sq")]
    return {"parameters": local_bytes(engine.model.parameters()), "gradients": gradient_bytes,
            "moments": local_bytes(moments)}


def peak_memory(device: torch.device) -> float:
    from rl_core import device as devices

    return devices.memory_stats(device)["peak_bytes"]


def run_rank(rank: int, world: int, strategy: str, args, rendezvous: str, out: str) -> None:
    import torch.distributed as dist

    from rl_core.engines.fsdp import FSDP2Engine
    from rl_core.engines.train import TrainEngine

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    device = torch.device("cpu") if args.device == "cpu" else torch.device(args.device, rank)
    if args.device != "cpu":
        torch.accelerator.set_device_index(rank)
    options = {"lr": 1e-5, "micro_batch_size": args.micro, "total_steps": args.steps}
    model = build(args.params)
    if strategy == "fsdp2":
        backend = "gloo" if args.device == "cpu" else "nccl"
        dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank,
                                world_size=world)
        from rl_core import device as devices

        engine = FSDP2Engine(model, mesh=devices.device_mesh(device, world),
                             param_dtype=args.dtype, **options)
    else:
        engine = TrainEngine(model, param_dtype=args.dtype, device=device, **options)
    data = batch(args.rows, args.seq)
    share = args.rows // world
    mine = {k: v[rank * share:(rank + 1) * share] for k, v in data.items()}
    grads = [0]
    optimizer_of(engine).register_step_pre_hook(  # the gradients exist only until the step
        lambda opt, *_: grads.__setitem__(0, local_bytes(
            p.grad for group in opt.param_groups for p in group["params"] if p.grad is not None)))
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        engine.train_step(mine, loss_fn)
        times.append(time.perf_counter() - start)
    state = training_state(engine, grads[0])
    start = time.perf_counter()
    for _bucket in engine.weight_buckets(bucket_bytes=256 << 20):
        pass
    sync = time.perf_counter() - start
    if rank == 0:
        torch.save({"state": state, "peak": peak_memory(device), "step_s": statistics.median(times),
                    "sync_s": sync}, out)
    if strategy == "fsdp2":
        dist.destroy_process_group()


def measure(strategy: str, world: int, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-fsdp-") as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.spawn(run_rank, args=(world, strategy, args, os.path.join(tmp, "rdv"), out),
                 nprocs=world, join=True)
        return torch.load(out, weights_only=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", choices=sorted(SHAPES), default="300m")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--micro", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    params = sum(p.numel() for p in build(args.params).parameters())
    print(f"{args.params}: {params / 1e6:.1f}M parameters, {args.dtype}, {args.rows} rows x "
          f"{args.seq} tokens, {args.steps} steps, device {args.device}, torch {torch.__version__}")
    rows = [("torch", 1), ("fsdp2", args.ranks)]
    results = {name: measure(name, world, args) for name, world in rows}
    gib = 2**30
    print(f"{'engine':<10} {'ranks':>5} {'params GiB':>10} {'grads GiB':>9} {'moments GiB':>11} "
          f"{'state GiB':>9} {'peak GiB':>8} {'step s':>7} {'sync s':>7}")
    for name, world in rows:
        r = results[name]
        state = r["state"]
        total = sum(state.values())
        print(f"{name:<10} {world:>5} {state['parameters'] / gib:>10.3f} "
              f"{state['gradients'] / gib:>9.3f} {state['moments'] / gib:>11.3f} "
              f"{total / gib:>9.3f} {r['peak'] / gib:>8.2f} {r['step_s']:>7.2f} {r['sync_s']:>7.3f}")
    ratio = sum(results["fsdp2"]["state"].values()) / sum(results["torch"]["state"].values())
    print(f"training state per rank, fsdp2 over {args.ranks} / plain: {ratio:.3f}x (aim <= 0.55x "
          "at 2 ranks)")


if __name__ == "__main__":
    main()
