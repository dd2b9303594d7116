"""Collectives that work on every backend: rl_core's one door to torch.distributed's reductions.

NCCL and HCCL reduce device tensors only ("No backend type associated with device type cpu"),
and HCCL has no float64; gloo reduces host tensors. A count or a sum made with `torch.tensor`
lands on the host and in float64 by habit, which works on gloo, the CPU tests' backend, and dies
at the first step on a GPU or an NPU. So every reduction in rl_core goes through `all_reduce`:
it puts the tensor where the group's backend takes it (`placement`, a pure function tested for
every backend on any host), in a dtype that backend has, reduces it and hands back a tensor on
the caller's device in the caller's dtype. `reduce_numbers` does the same for a few Python
numbers in one call (integers as int64, exact; other numbers as float32); `all_to_all`,
`all_to_all_rows` and `all_gather` move tensors the same way (context parallelism's exchanges,
expert parallelism's dispatch of tokens). `Link` is a process
group of its own between processes of different roles (a trainer rank and a rollout pool), each
keeping its role's default group, and broadcasts over it the same way.
tests/unit/test_layout.py fails on a collective called anywhere else in rl_core.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

# The device type each backend reduces on.
BACKEND_DEVICE = {"nccl": "cuda", "hccl": "npu", "gloo": "cpu", "mpi": "cpu"}
# Dtypes a backend lacks, and what a tensor of one travels as instead.
MISSING_DTYPES = {"hccl": {torch.float64: torch.float32}}


def backend_devices(backend: str) -> list[str]:
    """The device types a backend description reduces on: "nccl" -> ["cuda"]; the default
    group of several backends, "cpu:gloo,cuda:nccl" -> ["cpu", "cuda"]. ValueError for a
    backend rl_core does not know."""
    if ":" not in backend:
        if backend not in BACKEND_DEVICE:
            raise ValueError(f"unknown torch.distributed backend {backend!r}; rl_core knows "
                             f"{', '.join(BACKEND_DEVICE)}")
        return [BACKEND_DEVICE[backend]]
    return [part.split(":", 1)[0].strip() for part in backend.split(",")]


def _backend_on(backend: str, device_type: str) -> str:
    """The backend that reduces `device_type` tensors within a backend description."""
    if ":" not in backend:
        return backend
    for part in backend.split(","):
        kind, name = (s.strip() for s in part.split(":", 1))
        if kind == device_type:
            return name
    raise ValueError(f"{backend!r} has no backend for {device_type}")


def placement(backend: str, device: torch.device | str | None,
              dtype: torch.dtype) -> tuple[str, torch.dtype]:
    """Where (a device string), and as which dtype, a `dtype` tensor now on `device` (None:
    made without one, on the host) must travel for a collective on `backend`: on `device` when
    the backend reduces its device type, else on the backend's device type (the process's
    current device of it); float64 as float32 on HCCL. Strings, not torch.device: "npu" is a
    device type only where torch_npu is imported, and this is decided on any host."""
    types = backend_devices(backend)
    where = str(device) if device is not None else "cpu"
    if where.split(":")[0] not in types:
        where = types[-1]  # the accelerator of a mixed default group
    wire = MISSING_DTYPES.get(_backend_on(backend, where.split(":")[0]), {}).get(dtype, dtype)
    return where, wire


def all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
               op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
               backend: str | None = None) -> torch.Tensor:
    """`tensor` reduced over `group` with `op`: in place when it already lies where the group's
    backend reduces it, else a reduced copy on its own device and dtype (use the result)."""
    backend = backend or dist.get_backend(group)
    where, wire = placement(backend, tensor.device, tensor.dtype)
    if where == str(tensor.device) and tensor.dtype == wire:
        dist.all_reduce(tensor, op=op, group=group)
        return tensor
    moved = tensor.to(device=where, dtype=wire)
    dist.all_reduce(moved, op=op, group=group)
    return moved.to(device=tensor.device, dtype=tensor.dtype)


def reduce_numbers(values: Sequence[int | float], group: dist.ProcessGroup | None = None,
                   op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
                   device: torch.device | str | None = None) -> list[int | float]:
    """A few Python numbers reduced over `group` in one collective, on the device the group's
    backend reduces on (`device`, the caller's, when it does): all integers travel as int64
    (exact), otherwise float32. Returns them as Python numbers (one host sync)."""
    exact = all(isinstance(v, int) for v in values)
    backend = dist.get_backend(group)
    where, _ = placement(backend, device, torch.int64)
    tensor = torch.tensor(list(values), dtype=torch.int64 if exact else torch.float32,
                          device=where)
    dist.all_reduce(tensor, op=op, group=group)
    return tensor.tolist()


def _on_wire(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """`tensor` where, and in the dtype, the group's backend moves it (itself when it is)."""
    where, wire = placement(dist.get_backend(group), tensor.device, tensor.dtype)
    if where == str(tensor.device) and tensor.dtype == wire:
        return tensor.contiguous()
    return tensor.to(device=where, dtype=wire).contiguous()


def all_to_all(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Exchange the pieces of `tensor` (world, ...) over `group`: piece i goes to rank i, and
    piece j of the result came from rank j. On the caller's device and dtype."""
    sent = _on_wire(tensor, group)
    got = torch.empty_like(sent)
    dist.all_to_all_single(got, sent, group=group)
    return got.to(device=tensor.device, dtype=tensor.dtype)


def all_to_all_rows(tensor: torch.Tensor, send: Sequence[int], receive: Sequence[int],
                    group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Exchange rows of `tensor` (N, ...) over `group`, a different number with each rank: the
    first send[0] rows go to rank 0, the next send[1] to rank 1, ...; the result holds
    receive[j] rows from rank j, in rank order. On the caller's device and dtype."""
    sent = _on_wire(tensor, group)
    got = sent.new_empty((sum(receive), *sent.shape[1:]))
    dist.all_to_all_single(got, sent, output_split_sizes=list(receive),
                           input_split_sizes=list(send), group=group)
    return got.to(device=tensor.device, dtype=tensor.dtype)


def all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Every rank's `tensor` (all of one shape), stacked in rank order: (world, ...). On the
    caller's device and dtype."""
    sent = _on_wire(tensor, group)
    got = [torch.empty_like(sent) for _ in range(dist.get_world_size(group))]
    dist.all_gather(got, sent, group=group)
    return torch.stack(got).to(device=tensor.device, dtype=tensor.dtype)


def ring_pass(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
              shift: int = 1) -> torch.Tensor:
    """`tensor` sent to the rank `shift` places on in `group` (around the ring) and the one
    from `shift` places back received: what ring attention passes its keys and values by. On
    the caller's device and dtype."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    sent = _on_wire(tensor, group).reshape(-1)
    out = [sent.numel() if i == (rank - shift) % size else 0 for i in range(size)]
    into = [sent.numel() if i == (rank + shift) % size else 0 for i in range(size)]
    got = torch.empty_like(sent)
    dist.all_to_all_single(got, sent, output_split_sizes=out, input_split_sizes=into, group=group)
    return got.view(tensor.shape).to(device=tensor.device, dtype=tensor.dtype)


class Link:
    """A process group of `size` processes outside their default groups, joined over a
    TCPStore at `host:port` that rank 0 serves: every process keeps the group of its own role
    and talks to the other role through this one. `backend` is the roles' ("gloo" on CPUs,
    "nccl" on CUDA, "hccl" on Ascend); broadcasts travel as that backend takes them, as every
    collective here does.

        link = Link("10.0.0.5", 29600, rank, 1 + pool, "nccl")   # rank 0: the trainer
        tensor = link.broadcast(tensor, src=0)
    """

    def __init__(self, host: str, port: int, rank: int, size: int, backend: str,
                 timeout_s: float = 1800.0) -> None:
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, size, is_master=rank == 0, timeout=timeout)
        self.store = dist.PrefixStore("link", store)
        self.backend, self.rank, self.size = backend, rank, size
        self.group = _standalone_group(backend, self.store, rank, size, timeout)

    @property
    def device(self) -> str:
        """Where the backend moves tensors (this process's current device of its kind)."""
        return placement(self.backend, None, torch.uint8)[0]

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """`tensor` of rank `src` on every rank (each gives one of the same shape and dtype):
        in place where it lies where the backend moves it, else a copy on the caller's device
        and dtype (use the result)."""
        where, wire = placement(self.backend, tensor.device, tensor.dtype)
        moved = tensor
        if where != str(tensor.device) or tensor.dtype != wire or not tensor.is_contiguous():
            moved = tensor.to(device=where, dtype=wire).contiguous()
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = src, 0
        self.group.broadcast([moved], options).wait()
        return moved if moved is tensor else moved.to(device=tensor.device, dtype=tensor.dtype)


def _standalone_group(backend: str, store: dist.Store, rank: int, size: int,
                      timeout: timedelta) -> dist.ProcessGroup:
    """A `backend` process group over `store` that torch.distributed's world does not hold."""
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    if backend == "hccl":
        from torch_npu._C._distributed_c10d import ProcessGroupHCCL  # the Ascend image's

        options = ProcessGroupHCCL.Options()
        options._timeout = timeout
        return ProcessGroupHCCL(store, rank, size, options)
    raise ValueError(f"no standalone {backend!r} process group: rl_core links gloo, nccl and hccl")
