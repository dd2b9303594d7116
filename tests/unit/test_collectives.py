"""rl_core.collectives: every reduction travels where its group's backend takes it (NCCL and
HCCL take device tensors only, HCCL has no float64), shown for every backend on any host; and
real reductions on a gloo group of two ranks."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from rl_core.collectives import all_reduce, backend_devices, placement, reduce_numbers

CUDA0, NPU1 = torch.device("cuda", 0), "npu:1"  # torch.device("npu") needs torch_npu


@pytest.mark.parametrize(("backend", "device", "dtype", "expected"), [
    # a count made without a device, as `torch.tensor([n])` makes it, goes to the accelerator
    ("nccl", None, torch.int64, ("cuda", torch.int64)),
    ("hccl", None, torch.int64, ("npu", torch.int64)),
    ("nccl", "cpu", torch.float64, ("cuda", torch.float64)),
    # HCCL has no float64: it travels as float32
    ("hccl", "cpu", torch.float64, ("npu", torch.float32)),
    ("hccl", NPU1, torch.float64, ("npu:1", torch.float32)),
    # a tensor already on the backend's device stays on that very device
    ("nccl", CUDA0, torch.float32, ("cuda:0", torch.float32)),
    ("hccl", NPU1, torch.bfloat16, ("npu:1", torch.bfloat16)),
    # gloo reduces host tensors: a device tensor comes home
    ("gloo", None, torch.float64, ("cpu", torch.float64)),
    ("gloo", CUDA0, torch.float32, ("cpu", torch.float32)),
    # the default group of several backends: each device type to its own
    ("cpu:gloo,cuda:nccl", None, torch.float64, ("cpu", torch.float64)),
    ("cpu:gloo,cuda:nccl", CUDA0, torch.int64, ("cuda:0", torch.int64)),
    ("cpu:gloo,npu:hccl", NPU1, torch.float64, ("npu:1", torch.float32)),
])
def test_a_tensor_travels_where_its_groups_backend_takes_it(backend, device, dtype, expected):
    assert placement(backend, device, dtype) == expected


def test_a_device_no_backend_reduces_on_is_never_handed_to_it():
    for backend in ("nccl", "hccl", "gloo", "cpu:gloo,cuda:nccl"):
        for device in (None, "cpu", CUDA0, NPU1):
            where, wire = placement(backend, device, torch.float64)
            assert where.split(":")[0] in backend_devices(backend), (backend, device)
            assert not (backend.endswith("hccl") and wire == torch.float64)


def test_an_unknown_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="'ucc'.*nccl"):
        placement("ucc", None, torch.float32)


def _ranks(rank: int, world: int, rendezvous: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=world)
    try:
        results = {
            "max": reduce_numbers([rank + 3], op=dist.ReduceOp.MAX),
            "sum": reduce_numbers([rank + 1, 10 * rank]),
            "floats": reduce_numbers([0.5, rank + 0.25]),
        }
        values = torch.tensor([1.0, 2.0 * rank], dtype=torch.float64)
        same = all_reduce(values)  # gloo takes float64 host tensors: reduced in place
        results["in_place"] = same is values
        results["tensor"] = values.tolist()
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # see tests/unit/test_fsdp_engine.py `_in_group`


def test_reductions_on_a_gloo_group_of_two_ranks(tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rendezvous = tempfile.mkdtemp(dir=tmp_path, prefix="rendezvous-")
    out = tmp_path / "results.pt"
    mp.spawn(_ranks, args=(2, f"{rendezvous}/file", str(out)), nprocs=2, join=True)

    results = torch.load(out)
    assert results["max"] == [4]
    assert results["sum"] == [3, 10] and all(isinstance(v, int) for v in results["sum"])
    assert results["floats"] == [1.0, 1.5]
    assert results["in_place"] is True and results["tensor"] == [2.0, 2.0]
