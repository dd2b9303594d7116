"""rl_core.device: pure decisions for npu/gpu/cpu, CPU runtime paths, refusals, lazy torch_npu."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rl_core import device
from rl_core.device import CPU, GPU, NPU, DeviceUnavailable, get_kind
from rl_core.errors import InputError
from rl_core.spec import DEVICE_TYPES

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_npu_probe():
    """Forget the cached torch_npu import attempt before and after a test that fakes it."""
    device._torch_npu.cache_clear()
    yield
    device._torch_npu.cache_clear()


# ---- pure decisions ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, torch_type, backend, ray_resource, env",
    [
        ("npu", "npu", "hccl", "NPU", "ASCEND_RT_VISIBLE_DEVICES"),
        ("gpu", "cuda", "nccl", "GPU", "CUDA_VISIBLE_DEVICES"),
        ("cpu", "cpu", "gloo", "CPU", None),
    ],
)
def test_it_knows_each_kind(name, torch_type, backend, ray_resource, env):
    kind = get_kind(name)
    assert (kind.name, kind.torch_type, kind.backend) == (name, torch_type, backend)
    assert (kind.ray_resource, kind.visible_devices_env) == (ray_resource, env)
    assert device.backend_for(kind) == backend


def test_it_covers_exactly_the_specs_device_types():
    assert tuple(device.KINDS) == DEVICE_TYPES


def test_kinds_are_frozen():
    with pytest.raises(AttributeError):
        GPU.backend = "gloo"


@pytest.mark.parametrize("bad", ["cuda", "NPU", "tpu", ""])
def test_unknown_kind_names_the_valid_choices(bad):
    with pytest.raises(InputError, match=r"choose one of npu, gpu, cpu") as err:
        get_kind(bad)
    assert isinstance(err.value, ValueError)
    assert repr(bad) in str(err.value)


def test_cuda_gets_a_spelling_hint():
    with pytest.raises(ValueError, match=r"CUDA devices are spelled gpu"):
        get_kind("cuda")


@pytest.mark.parametrize(
    "kind, expected",
    [
        (NPU, {"NPU": 4, "CPU": 32}),  # 4 devices x 8 cores
        (GPU, {"GPU": 4, "CPU": 32}),
        (CPU, {"CPU": 32}),  # on cpu a "device" is a process: only cores are asked for
    ],
)
def test_ray_bundle(kind, expected):
    assert device.ray_resources(kind, devices=4, cpus_per_device=8) == expected


@pytest.mark.parametrize("devices, cpus", [(0, 1), (1, 0), (-1, 4)])
def test_ray_bundle_refuses_empty_requests(devices, cpus):
    with pytest.raises(ValueError, match="1 or more"):
        device.ray_resources(GPU, devices, cpus)


def test_visible_devices_value():
    assert device.visible_devices_value([0, 2, 3]) == "0,2,3"
    assert device.visible_devices_value([5]) == "5"
    assert device.visible_devices_value([]) == ""  # an empty value hides every device
    with pytest.raises(ValueError, match="0 or more"):
        device.visible_devices_value([0, -1])


@pytest.mark.parametrize(
    "kind, rank, expected",
    [(NPU, 0, "npu:0"), (NPU, 7, "npu:7"), (GPU, 1, "cuda:1"), (CPU, 0, "cpu"), (CPU, 3, "cpu")],
)
def test_local_device(kind, rank, expected):
    assert device.local_device(kind, rank) == expected


def test_local_device_refuses_negative_ranks():
    with pytest.raises(ValueError, match="local_rank"):
        device.local_device(GPU, -1)


# ---- runtime on this CPU host -----------------------------------------------------------------


def test_cpu_is_always_available():
    assert device.is_available(CPU)
    assert device.device_count(CPU) >= 1
    device.check_available(CPU, 10_000)  # oversubscribing cores is slow, not refused


def test_torch_device_on_cpu():
    assert device.torch_device(CPU, 2) == torch.device("cpu")


def test_cpu_memory_stats_are_positive_bytes():
    stats = device.memory_stats("cpu")
    assert stats["peak_bytes"] > 1e6  # a Python process with torch loaded holds well over 1 MB
    if Path("/proc/self/statm").exists():
        assert 1e6 < stats["allocated_bytes"] <= stats["peak_bytes"] * 1.01
    assert all(isinstance(v, float) for v in stats.values())


def test_cpu_memory_stats_accept_a_torch_device():
    assert device.memory_stats(torch.device("cpu")).keys() == device.memory_stats("cpu").keys()


def test_synchronize_and_empty_cache_are_noops_on_cpu():
    for d in ("cpu", torch.device("cpu")):
        device.synchronize(d)
        device.empty_cache(d)


def test_manual_seed_all_makes_random_draws_reproducible():
    device.manual_seed_all(CPU, 123)
    first = torch.rand(5)
    device.manual_seed_all(CPU, 123)
    assert torch.equal(first, torch.rand(5))
    device.manual_seed_all(CPU, 124)
    assert not torch.equal(first, torch.rand(5))


@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the no-CUDA path")
def test_manual_seed_all_for_an_absent_gpu_seeds_the_cpu_only():
    device.manual_seed_all(GPU, 7)
    first = torch.rand(3)
    device.manual_seed_all(GPU, 7)
    assert torch.equal(first, torch.rand(3))


def test_supports_dtype_on_cpu():
    assert device.supports_dtype(CPU, "float32") == (True, "float32 runs on every device")
    ok, reason = device.supports_dtype(CPU, "bfloat16")
    assert ok and "bfloat16 runs on cpu" in reason
    assert device.supports_dtype(CPU, "float16") == (
        False,
        "the training engine needs loss scaling for float16; use bfloat16 or float32",
    )


@pytest.mark.parametrize("kind", [NPU, GPU, CPU])
def test_float16_is_refused_everywhere(kind):
    ok, reason = device.supports_dtype(kind, "float16")
    assert not ok and "loss scaling" in reason


def test_supports_dtype_names_the_valid_dtypes():
    with pytest.raises(ValueError, match=r"'fp8'; choose one of float32, bfloat16, float16"):
        device.supports_dtype(CPU, "fp8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the no-CUDA path")
def test_bfloat16_on_an_absent_gpu_cannot_be_checked():
    ok, reason = device.supports_dtype(GPU, "bfloat16")
    assert not ok
    assert reason.startswith("cannot check bfloat16: no usable gpu device here")
    assert "torch.cuda.is_available() is False" in reason


def test_detect_falls_back_to_cpu_here():
    if device.is_available(NPU) or device.is_available(GPU):
        pytest.skip("this host has an accelerator")
    assert device.detect() is CPU


# ---- refusals on this CPU host ----------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the no-CUDA path")
def test_gpu_request_on_a_cpu_host_is_refused(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert not device.is_available(GPU)
    assert device.device_count(GPU) == 0
    with pytest.raises(DeviceUnavailable) as err:
        device.check_available(GPU, 2)
    assert str(err.value) == (
        "resources.device_type=gpu asks for 2 GPU devices per node; this host has 0 "
        "(torch.cuda.is_available() is False)"
    )
    assert isinstance(err.value, InputError)  # the CLI's exit 2: a retry here cannot fix it


@pytest.mark.skipif(torch.cuda.is_available(), reason="asserts the no-CUDA path")
def test_gpu_refusal_shows_the_visible_devices_variable(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(DeviceUnavailable, match=r"; CUDA_VISIBLE_DEVICES=''\)$"):
        device.check_available(GPU, 1)


def test_npu_request_without_torch_npu_is_refused(monkeypatch, fresh_npu_probe):
    monkeypatch.setattr(device.importlib.util, "find_spec", lambda name: None)
    assert not device.is_available(NPU)
    assert device.device_count(NPU) == 0
    with pytest.raises(DeviceUnavailable) as err:
        device.check_available(NPU, 8)
    assert str(err.value).startswith(
        "resources.device_type=npu asks for 8 NPU devices per node; this host has 0 "
        "(torch_npu is not installed"
    )
    with pytest.raises(DeviceUnavailable, match="needs torch_npu: torch_npu is not installed"):
        device.torch_device(NPU, 0)


def test_a_torch_npu_that_cannot_load_is_reported(tmp_path, monkeypatch, fresh_npu_probe):
    """Installed without CANN, torch_npu fails with an OSError; the refusal quotes it."""
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text(
        "raise OSError('libascend_hal.so: cannot open shared object file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not device.is_available(NPU)
    assert device.detect() is (GPU if torch.cuda.is_available() else CPU)
    with pytest.raises(DeviceUnavailable, match=r"torch_npu failed to import: libascend_hal\.so"):
        device.check_available(NPU, 1)


# ---- accelerator branches with torch's device module stood in for ----------------------------


def fake_device_module(count: int, bf16: bool | None) -> SimpleNamespace:
    """The slice of torch.cuda / torch.npu that rl_core.device calls."""
    calls = []
    module = SimpleNamespace(
        is_available=lambda: count > 0,
        device_count=lambda: count,
        synchronize=lambda d=None: calls.append(("synchronize", str(d))),
        empty_cache=lambda: calls.append(("empty_cache",)),
        memory_allocated=lambda d=None: 1024,
        max_memory_allocated=lambda d=None: 4096,
        manual_seed_all=lambda seed: calls.append(("manual_seed_all", seed)),
        calls=calls,
    )
    if bf16 is not None:
        module.is_bf16_supported = lambda: bf16
    return module


@pytest.fixture
def fake_npu(monkeypatch):
    """A host with torch_npu importable and 2 NPUs whose torch.npu has no is_bf16_supported."""
    module = fake_device_module(2, bf16=None)
    monkeypatch.setattr(device, "_torch_npu", lambda: (SimpleNamespace(), ""))
    monkeypatch.setattr(torch, "npu", module, raising=False)
    return module


def test_npu_runtime_calls_go_to_torch_npu(fake_npu):
    assert device.is_available(NPU) and device.device_count(NPU) == 2
    assert device.detect() is NPU
    device.check_available(NPU, 2)
    with pytest.raises(DeviceUnavailable, match=r"has 2 \(torch\.npu\.device_count\(\) is 2\)"):
        device.check_available(NPU, 4)
    device.synchronize("npu:1")
    device.empty_cache("npu:1")
    device.manual_seed_all(NPU, 5)
    assert fake_npu.calls == [("synchronize", "npu:1"), ("empty_cache",), ("manual_seed_all", 5)]
    assert device.memory_stats("npu:1") == {"allocated_bytes": 1024.0, "peak_bytes": 4096.0}
    assert device.supports_dtype(NPU, "bfloat16") == (
        True, "bfloat16 assumed on npu: 910B-class Ascend devices support it"
    )


def test_gpu_without_bfloat16_is_told_to_use_float32(monkeypatch):
    monkeypatch.setattr(torch, "cuda", fake_device_module(1, bf16=False))
    ok, reason = device.supports_dtype(GPU, "bfloat16")
    assert not ok and reason.endswith("is_bf16_supported() is False); use float32")
    monkeypatch.setattr(torch, "cuda", fake_device_module(1, bf16=True))
    ok, reason = device.supports_dtype(GPU, "bfloat16")
    assert ok and reason == "torch.cuda.is_bf16_supported() is True"


# ---- import hygiene ---------------------------------------------------------------------------


def test_importing_the_module_does_not_import_torch_npu(tmp_path):
    """Even with a torch_npu on the path (here one that would fail loudly), none is imported."""
    (tmp_path / "torch_npu").mkdir()
    (tmp_path / "torch_npu" / "__init__.py").write_text("raise SystemExit('torch_npu imported')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    code = (
        "import sys, rl_core.device as d; "
        "d.get_kind('npu'); d.local_device(d.NPU, 0); d.ray_resources(d.NPU, 1, 1); "
        "assert 'torch_npu' not in sys.modules, 'torch_npu imported'; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=False,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# ---- hardware ---------------------------------------------------------------------------------


@pytest.mark.hardware
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this host has none")
def test_on_a_real_gpu():
    _exercise_real(GPU)


@pytest.mark.hardware
@pytest.mark.skipif(not device.is_available(NPU), reason="needs torch_npu and an Ascend NPU")
def test_on_a_real_npu():
    _exercise_real(NPU)


def _exercise_real(kind):
    assert device.is_available(kind) and device.device_count(kind) >= 1
    device.check_available(kind, 1)
    d = device.torch_device(kind, 0)
    device.manual_seed_all(kind, 11)
    first = torch.rand(4, device=d)
    device.manual_seed_all(kind, 11)
    assert torch.equal(first, torch.rand(4, device=d))
    x = torch.ones(1024, 1024, device=d)
    device.synchronize(d)
    stats = device.memory_stats(d)
    assert stats["allocated_bytes"] >= x.numel() * 4  # float32
    assert stats["peak_bytes"] >= stats["allocated_bytes"]
    del x
    device.empty_cache(d)
    assert device.supports_dtype(kind, "float32")[0]
