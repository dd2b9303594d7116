"""`rollout.engine: auto`, the default: vLLM on gpu and npu where it is importable on the host that
starts the run, the native engine otherwise and always on cpu; the memory plan counts vLLM's share
wherever auto may take it."""

from __future__ import annotations

import importlib.util
import logging

import pytest

from rl_core import memory_plan as mp
from rl_core.admission import Facts, memory_verdict
from rl_core.errors import InputError
from rl_core.rollout import resolve_engine, vllm_available, with_resolved_engine
from rl_core.spec import RunSpec, planned_engine, resolve_spec

IMPORTABLE, MISSING = (lambda: True), (lambda: False)


def spec(kind: str = "cpu", output_dir: str = "outputs", **rollout) -> RunSpec:
    return resolve_spec({"data": {"synthetic": {"task": "addition"}},
                         "model": {"path": "tiny:nano"}, "resources": {"device_type": kind},
                         "rollout": rollout, "trainer": {"logger": [], "output_dir": output_dir}})


def test_auto_is_the_default():
    assert spec().rollout.engine == "auto"


@pytest.mark.parametrize("kind", ["gpu", "npu"])
def test_auto_on_an_accelerator_is_vllm_where_importable_and_native_where_not(kind):
    assert resolve_engine(spec(kind), IMPORTABLE) == "vllm"
    assert resolve_engine(spec(kind), MISSING) == "native"


def test_auto_on_cpu_is_native_whatever_vllm_is():
    assert resolve_engine(spec("cpu"), IMPORTABLE) == "native"
    assert resolve_engine(spec("cpu"), MISSING) == "native"


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_a_named_engine_is_itself_wherever_it_runs(kind):
    for engine in ("native", "vllm"):
        for check in (IMPORTABLE, MISSING):
            assert resolve_engine(spec(kind, engine=engine), check) == engine


def test_the_default_check_finds_vllm_without_importing_it():
    assert vllm_available() == (importlib.util.find_spec("vllm") is not None)
    assert resolve_engine(spec("gpu")) == ("vllm" if vllm_available() else "native")


def test_the_plan_takes_auto_for_vllm_on_accelerators_and_native_on_cpu():
    assert [planned_engine(spec(kind)) for kind in ("gpu", "npu", "cpu")] == [
        "vllm", "vllm", "native"]
    assert planned_engine(spec("gpu", engine="native")) == "native"
    assert planned_engine(spec("cpu", engine="vllm")) == "vllm"


def test_resolving_logs_the_choice_and_why(caplog):
    caplog.set_level(logging.INFO, logger="rl_core")
    runs = [with_resolved_engine(spec("gpu"), IMPORTABLE),
            with_resolved_engine(spec("gpu"), MISSING),
            with_resolved_engine(spec("cpu"), IMPORTABLE)]
    assert [s.rollout.engine for s in runs] == ["vllm", "native", "native"]
    assert [r.getMessage() for r in caplog.records] == [
        "rollout.engine auto: vllm (importable on this host)",
        "rollout.engine auto: native (vLLM is not importable here)",
        "rollout.engine auto: native (cpu)"]


def test_a_named_engine_is_not_resolved_again(caplog):
    caplog.set_level(logging.INFO, logger="rl_core")
    named = spec("gpu", engine="native")
    assert with_resolved_engine(named, IMPORTABLE) is named
    assert caplog.records == []


def test_auto_resolved_to_native_drops_vllms_settings_and_stays_a_valid_spec():
    asked = spec("gpu", gpu_memory_utilization=0.7, max_model_len=512)
    run = with_resolved_engine(asked, MISSING)
    assert (run.rollout.engine, run.rollout.gpu_memory_utilization,
            run.rollout.max_model_len) == ("native", 0.5, None)
    assert RunSpec.model_validate(run.model_dump()) == run  # what is saved resolves back
    assert asked.rollout.engine == "auto"  # the spec asked for is untouched
    kept = with_resolved_engine(asked, IMPORTABLE).rollout
    assert (kept.engine, kept.gpu_memory_utilization, kept.max_model_len) == ("vllm", 0.7, 512)


# --------------------------------------------------------------------------- the memory plan


def plan_dict(s: RunSpec) -> dict:
    """The plan, less the one line that says the spec asked for auto."""
    plan = mp.plan(s, mp.tiny_shape("nano"), 80 * mp.GIB).to_dict()
    assert plan["setup"].pop("engine_auto") == (s.rollout.engine == "auto")
    return plan


def test_the_plan_of_auto_on_a_gpu_is_the_plan_of_vllm():
    auto = plan_dict(spec("gpu"))
    assert auto == plan_dict(spec("gpu", engine="vllm"))
    assert "vLLM KV cache" in {c["name"] for c in auto["components"]}
    assert auto != plan_dict(spec("gpu", engine="native"))


def test_the_plan_of_auto_on_cpu_is_the_plan_of_native():
    auto = plan_dict(spec("cpu"))
    assert auto == plan_dict(spec("cpu", engine="native"))
    assert "vLLM KV cache" not in {c["name"] for c in auto["components"]}


def test_admission_counts_vllms_share_for_auto_on_a_gpu():
    verdict = memory_verdict(spec("gpu"), Facts(device_model="nvidia-h100"))
    cache = {c.name: c.bytes for c in verdict.plan.components}["vLLM KV cache"]
    weights = verdict.plan.parameters * verdict.plan.setup.dtype_bytes
    assert cache == int(0.5 * 80 * mp.GIB) - weights


# --------------------------------------------------------------------------- SFT


def test_sft_takes_auto_as_the_native_engine_and_refuses_vllm(tmp_path):
    from rl_core.recipes.sft import SFTTrainer

    with pytest.raises(InputError, match=r"rollout.engine: SFT validates with the native engine"
                                         r".*set rollout.engine: native or auto"):
        SFTTrainer(spec(output_dir=str(tmp_path), engine="vllm"))
    trainer = SFTTrainer(spec("gpu", str(tmp_path), gpu_memory_utilization=0.7))
    assert trainer.spec.rollout.engine == "native"
    assert type(trainer.rollout).__name__ == "NativeRolloutEngine"


# --------------------------------------------------------------------------- auto and memory


def test_the_plan_of_auto_is_the_native_engines_where_only_that_fits():
    """vLLM taking 95 % of the device leaves training no room; the native engine's rollout
    fits: auto is planned (and run) with the native engine, a named vllm is not."""
    greedy = spec("gpu", gpu_memory_utilization=0.95)
    auto = mp.plan(greedy, mp.tiny_shape("nano"), 80 * mp.GIB)
    named = mp.plan(spec("gpu", engine="vllm", gpu_memory_utilization=0.95),
                    mp.tiny_shape("nano"), 80 * mp.GIB)
    assert (auto.setup.rollout_engine, auto.fits) == ("native", True)
    assert (named.setup.rollout_engine, named.fits) == ("vllm", False)
    assert "vLLM KV cache" not in {c.name for c in auto.components}


def test_auto_runs_the_native_engine_where_vllms_share_would_not_fit(caplog):
    caplog.set_level(logging.INFO, logger="rl_core")
    greedy = spec("npu", gpu_memory_utilization=0.95)  # an NPU plans as a 64 GB 910B
    assert resolve_engine(greedy, IMPORTABLE) == "native"
    assert resolve_engine(spec("npu", gpu_memory_utilization=0.6), IMPORTABLE) == "vllm"
    assert with_resolved_engine(greedy, IMPORTABLE).rollout.engine == "native"
    assert caplog.records[-1].getMessage() == ("rollout.engine auto: native (by the memory plan "
                                               "vLLM's share of the device does not fit beside "
                                               "training)")
