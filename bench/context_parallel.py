"""Context parallelism: what one device keeps for the backward of a long packed micro-batch, and
its time, on one device against a group of two (gloo on CPU; nccl or hccl where `--device` is an
accelerator with two of them).

    python bench/context_parallel.py [--tokens 4096] [--rows 2] [--size small] [--threads 1]

One packed micro-batch of `--rows` rows of `--tokens` / rows tokens each (the response the last
half of each row) on the `--size` tiny preset, a forward and a backward of its response
log-probs through `TrainEngine` with remove padding: on one rank, and on two ranks of a
context-parallel group with Ulysses and with ring attention. Reported per case and rank: the
bytes autograd keeps for backward (every distinct storage saved during the forward, the
parameters excluded), the median seconds of three forward-and-backward passes, and the largest
difference of the log-probs from one rank's. The aim: a device of a group of two
keeps at most 0.6 of what one device keeps.
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

from rl_core.engines.train import TrainEngine  # noqa: E402
from rl_core.models.tiny import build_tiny  # noqa: E402


def batch(tokens: int, rows: int, seed: int = 0) -> dict[str, torch.Tensor]:
    width = tokens // rows
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (rows, width), generator=g)
    mask = torch.ones(rows, width, dtype=torch.long)
    positions = torch.arange(width).expand(rows, width).clone()
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}


def measure(engine: TrainEngine, data: dict[str, torch.Tensor], response: int,
            params: set[int]) -> dict[str, float]:
    """Saved bytes of one forward, and the median time of three forwards and backwards."""
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    times, logprobs = [], None
    for repeat in range(4):
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            logprobs, _ = engine.forward_logprobs(data["input_ids"], data["attention_mask"],
                                                  data["position_ids"], response, grad=True)
        logprobs.sum().backward()
        engine.model.zero_grad(set_to_none=True)
        if repeat:  # the first is a warm-up
            times.append(time.perf_counter() - start)
    assert logprobs is not None
    return {"saved_mib": sum(saved.values()) / 2**20, "seconds": statistics.median(times),
            "logprobs": logprobs.detach()}


def engine_of(size: str, cp_group=None, algorithm: str = "ulysses") -> tuple[TrainEngine, set]:
    model, _ = build_tiny(size, seed=1)
    engine = TrainEngine(model, lr=0.0, remove_padding=True, cp_group=cp_group,
                         cp_algorithm=algorithm)
    params = {p.untyped_storage().data_ptr() for p in engine.model.parameters()}
    return engine, params


def _rank(rank: int, rendezvous: str, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=2)
    data = batch(args.tokens, args.rows)
    result = {}
    for algorithm in ("ulysses", "ring"):
        engine, params = engine_of(args.size, dist.group.WORLD, algorithm)
        result[algorithm] = measure(engine, data, args.tokens // args.rows // 2, params)
    torch.save(result, f"{out}.{rank}")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens in the micro-batch")
    parser.add_argument("--rows", type=int, default=2, help="rows they are packed from")
    parser.add_argument("--size", default="small", help="tiny preset (nano, small, 30m, ...)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    engine, params = engine_of(args.size)
    one = measure(engine, batch(args.tokens, args.rows), args.tokens // args.rows // 2, params)
    folder = tempfile.mkdtemp(prefix="cp-bench-")
    out = f"{folder}/result"
    mp.spawn(_rank, args=(f"{folder}/rendezvous", args, out), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{rank}", weights_only=False) for rank in range(2)]

    rows = [{"case": "1 device", "rank": 0, "saved_mib": round(one["saved_mib"], 1),
             "ratio": 1.0, "seconds": round(one["seconds"], 3), "max_diff": 0.0}]
    for algorithm in ("ulysses", "ring"):
        for rank, result in enumerate(ranks):
            r = result[algorithm]
            rows.append({"case": f"2 devices, {algorithm}", "rank": rank,
                         "saved_mib": round(r["saved_mib"], 1),
                         "ratio": round(r["saved_mib"] / one["saved_mib"], 3),
                         "seconds": round(r["seconds"], 3),
                         "max_diff": float((r["logprobs"] - one["logprobs"]).abs().max())})
    print(f"context parallelism: {args.tokens} tokens in {args.rows} rows, tiny:{args.size}, "
          f"{args.threads} thread(s) a rank, torch {torch.__version__}")
    print("| case | rank | saved for backward (MiB) | / one device | seconds | max |dlogp| |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['case']} | {row['rank']} | {row['saved_mib']} | {row['ratio']} | "
              f"{row['seconds']} | {row['max_diff']:.1e} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
