"""The one place in rl_core that knows npu, cuda and cpu: names, backends, resources and calls.

Each accelerator kind is a `DeviceKind` record; callers ask this module for its collective
backend, Ray resource, visible-devices variable and torch device string instead of branching on
names themselves. The pure decisions (`ray_resources`, `local_device`, ...) need no device and
are tested on any host; the runtime helpers (`is_available`, `memory_stats`, ...) touch torch.

`torch_npu` is imported lazily, inside `_torch_npu()`, and only where installed: without
Ascend's CANN libraries importing it breaks `import torch` itself, so importing this module
never imports it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import resource
import sys
from dataclasses import dataclass
from types import ModuleType

import torch

from rl_core.errors import InputError


@dataclass(frozen=True)
class DeviceKind:
    """What rl_core needs to know about one kind of device."""

    name: str  # the spec's resources.device_type: "npu" | "gpu" | "cpu"
    torch_type: str  # torch device type: "npu" | "cuda" | "cpu"
    backend: str  # torch.distributed backend: "hccl" | "nccl" | "gloo"
    ray_resource: str  # Ray resource counted per device: "NPU" | "GPU" | "CPU"
    visible_devices_env: str | None  # variable that selects the devices a process sees


NPU = DeviceKind("npu", "npu", "hccl", "NPU", "ASCEND_RT_VISIBLE_DEVICES")
GPU = DeviceKind("gpu", "cuda", "nccl", "GPU", "CUDA_VISIBLE_DEVICES")
CPU = DeviceKind("cpu", "cpu", "gloo", "CPU", None)
KINDS: dict[str, DeviceKind] = {k.name: k for k in (NPU, GPU, CPU)}
DTYPES = ("float32", "bfloat16", "float16")


class DeviceUnavailable(InputError):
    """The spec asks for devices this host does not have; a retry here cannot fix it."""


def get_kind(device_type: str) -> DeviceKind:
    """`"gpu"` -> GPU. Raises InputError (a ValueError) naming the valid choices."""
    if device_type not in KINDS:
        hint = " (CUDA devices are spelled gpu)" if device_type == "cuda" else ""
        raise InputError(
            f"unknown device type {device_type!r}; choose one of {', '.join(KINDS)}{hint}"
        )
    return KINDS[device_type]


# ---- pure decisions ---------------------------------------------------------------------------


def backend_for(kind: DeviceKind) -> str:
    """The torch.distributed backend for this kind: hccl, nccl or gloo."""
    return kind.backend


def ray_resources(kind: DeviceKind, devices: int, cpus_per_device: int) -> dict[str, int]:
    """Resources of one Ray actor or placement-group bundle holding `devices` devices.

    On cpu a "device" is a training process, so only CPU cores are asked for.
    """
    if devices < 1 or cpus_per_device < 1:
        raise ValueError(
            f"devices and cpus_per_device must be 1 or more, got {devices} and {cpus_per_device}"
        )
    cpus = {"CPU": cpus_per_device * devices}
    return cpus if kind.torch_type == "cpu" else {kind.ray_resource: devices, **cpus}


def visible_devices_value(ids: list[int]) -> str:
    """[0, 2] -> "0,2", the value of CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES."""
    if any(i < 0 for i in ids):
        raise ValueError(f"device ids must be 0 or more, got {ids}")
    return ",".join(str(i) for i in ids)


def local_device(kind: DeviceKind, local_rank: int) -> str:
    """The torch device string for a process's local rank: "cuda:1", "npu:0"; always "cpu"."""
    if local_rank < 0:
        raise ValueError(f"local_rank must be 0 or more, got {local_rank}")
    return "cpu" if kind.torch_type == "cpu" else f"{kind.torch_type}:{local_rank}"


# ---- runtime ----------------------------------------------------------------------------------


@functools.cache
def _torch_npu() -> tuple[ModuleType | None, str]:
    """(torch_npu, "") where it imports, else (None, why not). Tried once per process."""
    if importlib.util.find_spec("torch_npu") is None:
        return None, "torch_npu is not installed"
    try:
        return importlib.import_module("torch_npu"), ""
    except (ImportError, OSError, RuntimeError) as exc:  # without CANN: OSError/RuntimeError
        return None, f"torch_npu failed to import: {exc}"


def is_available(kind: DeviceKind) -> bool:
    """Whether this process can use at least one device of this kind (cpu: always)."""
    if kind.torch_type == "cpu":
        return True
    if kind.torch_type == "cuda":
        return torch.cuda.is_available()
    return _torch_npu()[0] is not None and _module("npu").is_available()


def device_count(kind: DeviceKind) -> int:
    """Devices of this kind visible to this process; for cpu, the cores it may run on."""
    if kind.torch_type == "cpu":
        if hasattr(os, "sched_getaffinity"):  # Linux: honours taskset and container CPU sets
            return len(os.sched_getaffinity(0))
        return os.cpu_count() or 1
    return _module(kind.torch_type).device_count() if is_available(kind) else 0


def check_available(kind: DeviceKind, needed: int) -> None:
    """Raise DeviceUnavailable unless this host has `needed` devices of `kind` per node.

    cpu always passes: any number of training processes can run, slowly beyond the core count.
    """
    have = device_count(kind)
    if kind.torch_type == "cpu" or needed <= have:
        return
    raise DeviceUnavailable(
        f"resources.device_type={kind.name} asks for {needed} {kind.ray_resource} devices per "
        f"node; this host has {have} ({_why(kind, have)})"
    )


def _why(kind: DeviceKind, have: int) -> str:
    if kind.torch_type == "npu" and _torch_npu()[0] is None:
        why = _torch_npu()[1]
    elif not is_available(kind):
        why = f"torch.{kind.torch_type}.is_available() is False"
    else:
        why = f"torch.{kind.torch_type}.device_count() is {have}"
    env = kind.visible_devices_env
    return why + (f"; {env}={os.environ[env]!r}" if env and env in os.environ else "")


def detect() -> DeviceKind:
    """The best kind this host offers: npu where torch_npu is usable, else gpu, else cpu."""
    return next((k for k in (NPU, GPU) if is_available(k)), CPU)


def torch_device(kind: DeviceKind, local_rank: int) -> torch.device:
    """torch.device for a local rank; for npu, imports torch_npu first (it registers "npu")."""
    if kind.torch_type == "npu" and _torch_npu()[0] is None:
        raise DeviceUnavailable(f"resources.device_type=npu needs torch_npu: {_torch_npu()[1]}")
    return torch.device(local_device(kind, local_rank))


def _device_type(device: torch.device | str) -> str:
    return str(device).split(":")[0]  # a string, so "npu:0" parses before torch_npu is imported


def _module(torch_type: str) -> ModuleType:
    return getattr(torch, torch_type)  # torch.cuda, or torch.npu once torch_npu is imported


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (for timing and memory readings); a no-op on cpu."""
    if _device_type(device) != "cpu":
        _module(_device_type(device)).synchronize(device)


def empty_cache(device: torch.device | str) -> None:
    """Return the caching allocator's free blocks to the device; a no-op on cpu."""
    if _device_type(device) != "cpu":
        _module(_device_type(device)).empty_cache()


def memory_stats(device: torch.device | str) -> dict[str, float]:
    """{"allocated_bytes", "peak_bytes"} for the device.

    On an accelerator: tensor memory now and its peak since start (or the last `reset_peak`).
    On cpu: this process's resident set now (from /proc/self/statm; left out where that file
    does not exist) and its peak resident set since start or the last `reset_peak` (VmHWM; where
    /proc is missing, getrusage, never reset).
    """
    if _device_type(device) != "cpu":
        mod = _module(_device_type(device))
        return {"allocated_bytes": float(mod.memory_allocated(device)),
                "peak_bytes": float(mod.max_memory_allocated(device))}
    stats = {"peak_bytes": _peak_rss()}
    try:
        with open("/proc/self/statm") as f:
            stats["allocated_bytes"] = float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except OSError:
        pass
    return stats


def reset_peak(device: torch.device | str) -> None:
    """Start a new peak for `memory_stats`: the device's peak allocation, or on cpu the
    process's peak resident set (Linux: writing 5 to /proc/self/clear_refs)."""
    if _device_type(device) != "cpu":
        _module(_device_type(device)).reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # no /proc (macOS): the peak is the process's since start


def profiler_for(device: torch.device | str) -> tuple[ModuleType, str]:
    """(the profiler module, the device's torch type) for tracing work on `device`:
    `torch_npu.profiler` on npu (its traces hold the NPU's operators), else `torch.profiler`
    (CPU operators, and CUDA kernels on cuda)."""
    torch_type = _device_type(device)
    if torch_type == "npu":
        torch_npu, why = _torch_npu()
        if torch_npu is None:
            raise DeviceUnavailable(f"tools.profiling on npu needs torch_npu: {why}")
        return importlib.import_module("torch_npu.profiler"), torch_type
    return importlib.import_module("torch.profiler"), torch_type


def _peak_rss() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(int(line.split()[1]) * 1024)  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak if sys.platform == "darwin" else peak * 1024)  # Linux: KiB


def manual_seed_all(kind: DeviceKind, seed: int) -> None:
    """Seed torch's CPU generator and, where the kind is usable, every device's generator."""
    torch.manual_seed(seed)
    if kind.torch_type != "cpu" and is_available(kind):
        _module(kind.torch_type).manual_seed_all(seed)


def supports_dtype(kind: DeviceKind, dtype: str) -> tuple[bool, str]:
    """Pre-flight: can the training engine run in `dtype` on this kind here? (answer, reason).

    Assumptions: float16 is refused everywhere because the training engine has no loss scaling.
    bfloat16 on cuda is asked of torch (Ampere and newer). On npu it is asked of torch.npu where
    torch_npu offers `is_bf16_supported`, else assumed: Ascend 910B-class devices and newer
    (Atlas A2/A3, the only ones the Ascend image targets) have it.
    """
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    if dtype == "float32":
        return True, "float32 runs on every device"
    if dtype == "float16":
        return False, "the training engine needs loss scaling for float16; use bfloat16 or float32"
    if kind.torch_type == "cpu":
        return True, "bfloat16 runs on cpu, though float32 is as fast there and keeps small updates"
    if not is_available(kind):
        return False, f"cannot check bfloat16: no usable {kind.name} device here ({_why(kind, 0)})"
    probe = getattr(_module(kind.torch_type), "is_bf16_supported", None)
    if probe is None:
        return True, "bfloat16 assumed on npu: 910B-class Ascend devices support it"
    if probe():
        return True, f"torch.{kind.torch_type}.is_bf16_supported() is True"
    return False, (f"this {kind.name} lacks bfloat16 "
                   f"(torch.{kind.torch_type}.is_bf16_supported() is False); use float32")


def device_mesh(device: torch.device, size: int, tensor_parallel: int = 1,
                expert_parallel: int = 1):
    """A device mesh of `size` ranks over the default process group, with the device type
    always given: one-dimensional (FSDP2 shards over it), or with `tensor_parallel` > 1 two
    dimensions, "shard" × "tp" (blocks of `tensor_parallel` consecutive ranks split the
    model's matrices; FSDP2 shards over the rest), or with `expert_parallel` > 1 two
    dimensions "edp" × "ep" (blocks of `expert_parallel` consecutive ranks split the experts;
    `rl_core.engines.experts`)."""
    from torch.distributed.device_mesh import init_device_mesh

    if tensor_parallel > 1 and expert_parallel > 1:
        raise ValueError("tensor and expert parallelism together are not supported")
    if expert_parallel > 1:
        return init_device_mesh(device.type, (size // expert_parallel, expert_parallel),
                                mesh_dim_names=("edp", "ep"))
    if tensor_parallel == 1:
        return init_device_mesh(device.type, (size,))
    return init_device_mesh(device.type, (size // tensor_parallel, tensor_parallel),
                            mesh_dim_names=("shard", "tp"))
