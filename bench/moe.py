"""Expert parallelism: the step time and what a rank holds of a mixture of experts, FSDP2 over two
ranks without and with the experts split over them (gloo on CPU).

    python bench/moe.py [--size moe] [--rows 4] [--tokens 256] [--threads 1] [--repeats 3]

The `--size` tiny preset (a Qwen3-MoE shape) trained by the FSDP2 engine on two ranks, each its
own `--rows` rows of `--tokens` tokens: as FSDP2 shards it over both (EP 1: every rank gathers
each layer's experts in full to compute its own tokens), and with `parallel.expert_parallel_size`
2 (EP 2: each rank holds half of every layer's experts and computes the tokens routed to them,
which travel there and back by all-to-all). Reported per case and rank: the median seconds of
`--repeats` update steps (after a warm-up), the bytes of its parameters, gradients and AdamW
moments, the parameters it gathers to compute one layer (`gathered layer`), and the process's peak
resident memory. Figures only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_core.models.tiny import build_tiny  # noqa: E402
from tensor_parallel import batch, loss_fn  # noqa: E402  (this folder's: the same update)


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _rank(rank: int, rendezvous: str, args: argparse.Namespace, expert_parallel: int,
          out: str) -> None:
    import torch.distributed as dist

    from rl_core.device import device_mesh
    from rl_core.engines.fsdp import FSDP2Engine

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    model, _ = build_tiny(args.size, seed=1)
    experts = model.model.layers[0].mlp.experts
    layer_experts = experts.gate_up_proj.numel() + experts.down_proj.numel()
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    mesh = device_mesh(torch.device("cpu"), 2, expert_parallel=expert_parallel)
    engine = FSDP2Engine(model, mesh=mesh, lr=1e-5, router_aux_loss_coef=0.001)
    data = batch(args.rows, args.tokens, seed=rank)
    times = []
    for repeat in range(args.repeats + 1):
        start = time.perf_counter()
        metrics = engine.train_step(data, loss_fn)
        if repeat:  # the first is a warm-up (and makes the moments)
            times.append(time.perf_counter() - start)
    params = list(engine.model.parameters())
    moments = [v for state in engine.inner.optimizer.state.values() for k, v in state.items()
               if k != "step"]
    state = 2 * sum(_local_bytes(p) for p in params) + sum(_local_bytes(m) for m in moments)
    gathered = layer - layer_experts * (expert_parallel - 1) // expert_parallel
    torch.save({"seconds": statistics.median(times), "state": state, "gathered": gathered * 4,
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "load_max": metrics["actor/moe/load_max"]}, f"{out}.{rank}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="moe", help="tiny MoE preset (moe-nano, moe)")
    parser.add_argument("--rows", type=int, default=4, help="rows of an update, a rank")
    parser.add_argument("--tokens", type=int, default=256, help="tokens a row")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    folder = tempfile.mkdtemp(prefix="moe-bench-")
    rows = []
    for ep in (1, 2):
        out = f"{folder}/ep{ep}"
        mp.spawn(_rank, args=(f"{folder}/rendezvous-{ep}", args, ep, out), nprocs=2, join=True)
        rows += [{"case": f"EP {ep}", "rank": rank,
                  **torch.load(f"{out}.{rank}", weights_only=False)} for rank in range(2)]
    mib = 2**20
    base = {row["rank"]: row for row in rows if row["case"] == "EP 1"}
    print(f"expert parallelism: tiny:{args.size}, 2 ranks x {args.rows} rows x {args.tokens} "
          f"tokens, {args.threads} thread(s) a rank, torch {torch.__version__}")
    print("| case | rank | update (s) | / EP 1 | parameters + gradients + moments (MiB) "
          "| gathered layer (MiB) | peak RSS (MiB) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['case']} | {row['rank']} | {row['seconds']:.3f} | "
              f"{row['seconds'] / base[row['rank']]['seconds']:.2f} | {row['state'] / mib:.1f} | "
              f"{row['gathered'] / mib:.2f} | {row['peak_rss'] / mib:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
