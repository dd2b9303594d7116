"""Weights from a trainer's ranks to a rollout process of another role, over a `Link` of their
own (gloo here): two FSDP2 ranks in one process group take a step and send their weights
bucket by bucket from rank 0; a native rollout engine in a group of its own receives them, bit
for bit, and any dtype crosses unchanged."""

from __future__ import annotations

import os
import socket
import sys
import tempfile

import torch
import torch.multiprocessing as mp

BF16 = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16) / 7
COUNTS = torch.tensor([3, -1, 2**40])


def _process(index: int, folder: str, port: int, out: str) -> None:
    """Processes 0 and 1: the trainer's group; process 2: the rollout, in a group of one.
    Link ranks: 0 the trainer's rank 0, 1 the rollout (the trainer's rank 1 is not on it)."""
    import torch.distributed as dist

    trainer = index < 2
    rendezvous = f"file://{folder}/{'trainer' if trainer else 'rollout'}"
    dist.init_process_group("gloo", init_method=rendezvous, rank=index if trainer else 0,
                            world_size=2 if trainer else 1)
    try:
        _work(index, port, out)
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as tests/ranks.py's ranks leave


def _work(index: int, port: int, out: str) -> None:
    from test_fsdp_engine import OPTIONS, batches
    from test_train_engine import ppo_loss_fn
    from torch.distributed.device_mesh import init_device_mesh

    from rl_core.collectives import Link
    from rl_core.engines.fsdp import FSDP2Engine
    from rl_core.models.tiny import build_tiny
    from rl_core.rollout.native import NativeRolloutEngine
    from rl_core.rollout.transfer import receive_weights, send_weights

    link = None if index == 1 else Link("127.0.0.1", port, 0 if index == 0 else 1, 2, "gloo")
    if index < 2:
        model, tokenizer = build_tiny("nano", seed=1)
        data = batches(tokenizer.pad_token_id, model)
        engine = FSDP2Engine(model, mesh=init_device_mesh("cpu", (2,)), **OPTIONS)
        engine.train_step(data[0], ppo_loss_fn())
        sent = send_weights(link, engine.weight_buckets(bucket_bytes=16 << 10), version=1)
        trained = engine.full_state_dict()
        if index == 0:
            send_weights(link, [[("bf16", BF16), ("counts", COUNTS)]], version=2)
            torch.save({"trained": trained, "sent": sent}, f"{out}.trainer")
        return
    rollout = NativeRolloutEngine(build_tiny("nano", seed=2)[0], eos_token_ids=[0],
                                  pad_token_id=256)
    buckets = []

    def counted():
        for bucket in receive_weights(link, version=1):
            buckets.append([name for name, _ in bucket])
            yield bucket

    rollout.load_weights(counted(), version=1)
    extra = [[(name, tensor.clone()) for name, tensor in bucket]  # views of one buffer
             for bucket in receive_weights(link, version=2)]
    torch.save({"received": {k: v.clone() for k, v in rollout.model.state_dict().items()},
                "buckets": buckets, "extra": extra}, f"{out}.rollout")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_trainers_weights_reach_a_rollout_of_another_group_bit_for_bit(tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    folder = tempfile.mkdtemp(dir=tmp_path)
    out = str(tmp_path / "result")
    mp.spawn(_process, args=(folder, free_port(), out), nprocs=3, join=True)
    trainer = torch.load(f"{out}.trainer", weights_only=False)
    rollout = torch.load(f"{out}.rollout", weights_only=False)
    trained, received = trainer["trained"], rollout["received"]
    assert set(trained) <= set(received)
    for name, tensor in trained.items():
        assert torch.equal(received[name], tensor), name
    assert len(rollout["buckets"]) > 3  # 16 KiB buckets: several collectives, one a bucket
    assert trainer["sent"] == sum(t.numel() * t.element_size() for t in trained.values())
    ((bf16, counts),) = rollout["extra"]
    assert bf16[0] == "bf16" and bf16[1].dtype == torch.bfloat16 and torch.equal(bf16[1], BF16)
    assert counts[0] == "counts" and torch.equal(counts[1], COUNTS)
