"""Tensor parallelism: what one device holds of the training state, the time of an update and of
gathering the full weights for the rollout, on one device against a tensor-parallel group of two
(gloo on CPU).

    python bench/tensor_parallel.py [--size base] [--rows 4] [--tokens 512] [--threads 1]
                                    [--bucket-mib 4]

The `--size` tiny preset trained by the FSDP2 engine with remove padding: on one rank, and on
two ranks whose mesh is one FSDP2 shard × two tensor-parallel parts (`rl_core.engines.tensor`).
Reported per case and rank: the bytes of its parameters, gradients and AdamW moments (the local
storage of each; DTensors count their local part), the median seconds of three update steps on
`--rows` rows of `--tokens` tokens, and the resharding for the rollout after an update: the
seconds of gathering every weight in full, bucket by bucket (`weight_buckets` of `--bucket-mib`),
and of syncing them into a rollout group of as many ranks (each keeping its part of the layers,
`rl_core.rollout.parts`), with the largest bucket (the extra memory a rank holds while syncing)
and the rollout's part against the model's size.
The aim: a device of a group of two holds at most 0.55 of one device's training state.
Figures only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_core.models.tiny import build_tiny  # noqa: E402
from rl_core.rollout.native import NativeRolloutEngine  # noqa: E402
from rl_core.rollout.parts import split_layers  # noqa: E402


def batch(rows: int, tokens: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """`rows` full rows of `tokens` tokens, the response their second half, with PPO's columns."""
    g = torch.Generator().manual_seed(seed)
    response = tokens // 2
    return {"input_ids": torch.randint(0, 256, (rows, tokens), generator=g),
            "attention_mask": torch.ones(rows, tokens, dtype=torch.long),
            "position_ids": torch.arange(tokens).expand(rows, tokens).clone(),
            "response_mask": torch.ones(rows, response),
            "old_logprobs": torch.full((rows, response), -5.0),
            "advantages": torch.randn(rows, response, generator=g)}


def loss_fn(micro, logprobs, _entropy):
    ratio = (logprobs - micro["old_logprobs"]).exp()
    return -(ratio * micro["advantages"]).mean(), {}


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def measure(mesh, args: argparse.Namespace) -> dict[str, float]:
    """Training-state bytes, update seconds and a full weight gather, on this rank."""
    from rl_core.engines.fsdp import FSDP2Engine

    model, _ = build_tiny(args.size, seed=1)
    engine = FSDP2Engine(model, mesh=mesh, lr=1e-5, remove_padding=True)
    data = batch(args.rows, args.tokens)
    times = []
    for repeat in range(4):
        start = time.perf_counter()
        engine.train_step(data, loss_fn)
        if repeat:  # the first is a warm-up (and makes the moments)
            times.append(time.perf_counter() - start)
    params = list(engine.model.parameters())
    logprobs, _ = engine.forward_logprobs(data["input_ids"], data["attention_mask"],
                                          data["position_ids"], args.tokens // 2, grad=True)
    logprobs.sum().backward()  # gradients as an update holds them
    moments = [v for state in engine.inner.optimizer.state.values() for k, v in state.items()
               if k != "step"]
    state = {"parameters": sum(_local_bytes(p) for p in params),
             "gradients": sum(_local_bytes(p.grad) for p in params if p.grad is not None),
             "moments": sum(_local_bytes(m) for m in moments)}
    engine.model.zero_grad(set_to_none=True)
    bucket_bytes = args.bucket_mib << 20
    start = time.perf_counter()
    sizes = [sum(t.numel() * t.element_size() for _, t in bucket)
             for bucket in engine.weight_buckets(bucket_bytes)]
    gather_seconds = time.perf_counter() - start
    rollout = _rollout_group(args.size, mesh)
    start = time.perf_counter()
    rollout.load_weights(engine.weight_buckets(bucket_bytes))
    sync_seconds = time.perf_counter() - start
    part = sum(t.numel() * t.element_size() for t in rollout.model.state_dict().values())
    return {**state, "state": sum(state.values()), "seconds": statistics.median(times),
            "gather_seconds": gather_seconds, "gathered": sum(sizes), "largest_bucket": max(sizes),
            "sync_seconds": sync_seconds, "rollout_part": part}


def _rollout_group(size: str, mesh) -> NativeRolloutEngine:
    """A native rollout over this rank's part of the layers: a group of the mesh's size."""
    import torch.distributed as dist

    group, ranks = (dist.group.WORLD, dist.get_world_size()) if mesh.size() > 1 else (None, 1)
    model, tokenizer = build_tiny(size, seed=2)
    model = split_layers(model, dist.get_rank() if group else 0, ranks)
    return NativeRolloutEngine(model, eos_token_ids=[tokenizer.eos_token_id],
                               pad_token_id=tokenizer.pad_token_id, group=group)


def _rank(rank: int, rendezvous: str, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("shard", "tp"))
    torch.save(measure(mesh, args), f"{out}.{rank}")
    dist.destroy_process_group()


def _alone(rank: int, rendezvous: str, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=0, world_size=1)
    torch.save(measure(init_device_mesh("cpu", (1,)), args), out)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="base", help="tiny preset (nano, small, base)")
    parser.add_argument("--rows", type=int, default=4, help="rows of an update")
    parser.add_argument("--tokens", type=int, default=512, help="tokens a row")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--bucket-mib", type=int, default=4,
                        help="bucket size of the weight sync (the runs' default is 512)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    folder = tempfile.mkdtemp(prefix="tp-bench-")
    out = f"{folder}/result"
    mp.spawn(_alone, args=(f"{folder}/alone", args, f"{out}.alone"), nprocs=1, join=True)
    mp.spawn(_rank, args=(f"{folder}/rendezvous", args, out), nprocs=2, join=True)
    one = torch.load(f"{out}.alone", weights_only=False)
    ranks = [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(2)]
    rows = [{"case": "1 device", "rank": 0, **one}]
    rows += [{"case": "TP 2, rollout group of 2", "rank": rank, **r}
             for rank, r in enumerate(ranks)]
    mib = 2**20
    print(f"tensor parallelism: tiny:{args.size}, {args.rows} rows x {args.tokens} tokens, "
          f"{args.threads} thread(s) a rank, torch {torch.__version__}")
    print("| case | rank | parameters + gradients + moments (MiB) | / one device | update (s) "
          "| gather (s) | sync into the rollout (s) | largest bucket (MiB) | rollout part / model |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        row["ratio"] = row["state"] / one["state"]
        print(f"| {row['case']} | {row['rank']} | {row['state'] / mib:.1f} | {row['ratio']:.3f} "
              f"| {row['seconds']:.3f} | {row['gather_seconds']:.3f} | "
              f"{row['sync_seconds']:.3f} | {row['largest_bucket'] / mib:.1f} | "
              f"{row['rollout_part'] / one['rollout_part']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
