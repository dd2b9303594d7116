"""Megatron-Core on the CPU, for the tests of the Megatron engine.

    from megatron_cpu import on_cpu
    on_cpu()        # in a spawned rank, before anything of Megatron is built

Megatron-Core places its tensors on `torch.cuda.current_device()` and literal "cuda" devices,
moves modules with `.cuda()`, and checks parameter types by their CUDA names. Here those are
pointed at the CPU: a torch function mode turns every CUDA `device=` argument and `.to(cuda)`
into the CPU and every `.cuda()` into a no-op, `Tensor.type()` answers with the CUDA type name,
`torch.cuda.current_device` / `synchronize` and `torch.accelerator`'s current device answer for
the CPU, and the tensor-parallel RNG tracker's fork (CUDA RNG states) is a plain context.
Megatron's own code then runs unchanged in float32 on gloo ranks: its layers (the local ones,
without Transformer Engine), schedules, DDP and distributed optimizer, checkpoints. What this
cannot show is what only an accelerator has: fused kernels, bfloat16 numerics, NCCL/HCCL, speed
(bench/device_check.py's megatron line runs there).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

CPU = torch.device("cpu")


def _on_cpu(device: Any) -> Any:
    """`device`, with a CUDA one (or a bare CUDA index) replaced by the CPU."""
    if isinstance(device, bool):
        return device
    if isinstance(device, int):
        return CPU
    if isinstance(device, str) and device.startswith("cuda"):
        return CPU
    if isinstance(device, torch.device) and device.type == "cuda":
        return CPU
    return device


class CudaOnCpu(TorchFunctionMode):
    """Every CUDA placement of a torch call made on the CPU instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name == "cuda" and args and isinstance(args[0], torch.Tensor):
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        if name == "to" and args and isinstance(args[0], torch.Tensor):
            args = (args[0], *(_on_cpu(a) if not isinstance(a, torch.dtype | torch.Tensor) else a
                               for a in args[1:]))
        out = func(*args, **kwargs)
        if name == "type" and len(args) == 1 and not kwargs and isinstance(out, str) \
                and ".cuda." not in out:  # Megatron's optimizers check CUDA type names
            return out.replace("torch.", "torch.cuda.", 1)
        return out


def on_cpu() -> None:
    """Point Megatron-Core's device calls at the CPU in this process (for good)."""
    from megatron.core.tensor_parallel import random as megatron_random

    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.accelerator.current_accelerator = lambda *args, **kwargs: CPU
    torch.accelerator.current_device_index = lambda: 0
    megatron_random.CudaRNGStatesTracker.fork = \
        lambda self, *args, **kwargs: contextlib.nullcontext()
    CudaOnCpu().__enter__()
