"""Rollout: generating responses from prompts, beside the training engines (rl_core.engines).

    sampling.py   SamplingParams and the sampling kernels every engine shares
    native.py     NativeRolloutEngine: over the training weights in the same process
    decoder.py    its fast decoder (static KV cache) and the Hugging Face decoder
    vllm.py       VLLMRolloutEngine: vLLM in process
    base.py       the RolloutEngine Protocol the roles call

Engines are chosen by `rollout.engine`, `auto` made concrete once where the run starts:

    spec = with_resolved_engine(spec)              # auto: vllm on gpu/npu if importable, or native
    rollout_class = rollout_engine("native")       # rl_core.rollout.native.NativeRolloutEngine
    rollout_class = rollout_engine("vllm")         # rl_core.rollout.vllm.VLLMRolloutEngine
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from typing import Any

from rl_core.engines import load_engine
from rl_core.spec import RolloutConfig, RunSpec, planned_engine

log = logging.getLogger("rl_core")

# name -> "module:class"; imported on first use (they import torch and their backends)
ROLLOUT_ENGINES = {"native": "rl_core.rollout.native:NativeRolloutEngine",
                   "vllm": "rl_core.rollout.vllm:VLLMRolloutEngine"}

# the rollout settings only vLLM reads, back at their defaults when a run takes the native engine
VLLM_SETTINGS = ("gpu_memory_utilization", "max_model_len")


def rollout_engine(name: str) -> Any:
    """The rollout engine class of `rollout.engine`."""
    return load_engine(ROLLOUT_ENGINES, name, "rollout.engine")


def vllm_available() -> bool:
    """Whether vLLM is importable here (found on the path, not imported: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_engine(spec: RunSpec, vllm_importable: Callable[[], bool] | None = None) -> str:
    """The rollout engine a run of `spec` takes on this host, "native" or "vllm": `auto` is vLLM
    on gpu and npu when `vllm_importable()` says so (default: `vllm_available`) and, by the
    memory plan, its share of the device fits beside training or the native engine's rollout
    would not fit either; else the native engine, and the native engine on cpu whatever vLLM
    is; the others are themselves."""
    planned = planned_engine(spec)
    if spec.rollout.engine != "auto" or planned == "native":
        return planned
    if not (vllm_importable or vllm_available)():
        return "native"
    return _fitting_engine(spec)


def _fitting_engine(spec: RunSpec) -> str:
    """vLLM, unless by the memory plan its share of the device would not fit beside training
    where the native engine's rollout does (the plan then is the native engine's)."""
    from rl_core.errors import InputError
    from rl_core.memory_plan import plan

    try:
        return plan(spec).setup.rollout_engine
    except InputError:  # a model whose shape is unknown here: no plan, no reason against vLLM
        return "vllm"


def with_engine(spec: RunSpec, engine: str) -> RunSpec:
    """`spec` with `rollout.engine` set to `engine`; with the native engine, vLLM's settings
    (which `auto` on gpu and npu may carry) go back to their defaults, so the spec still passes
    its rules and is saved as it runs."""
    update: dict[str, Any] = {"engine": engine}
    if engine == "native":
        defaults = RolloutConfig()
        update.update({name: getattr(defaults, name) for name in VLLM_SETTINGS})
    return spec.model_copy(update={"rollout": spec.rollout.model_copy(update=update)})


def with_resolved_engine(spec: RunSpec,
                         vllm_importable: Callable[[], bool] | None = None) -> RunSpec:
    """`spec` with `rollout.engine: auto` made concrete by `resolve_engine`, logging the choice
    and why; the same spec when it names its engine."""
    if spec.rollout.engine != "auto":
        return spec
    importable = (vllm_importable or vllm_available)()
    engine = resolve_engine(spec, lambda: importable)
    if spec.resources.device_type == "cpu":
        why = "cpu"
    elif engine == "vllm":
        why = "importable on this host"
    elif not importable:
        why = "vLLM is not importable here"
    else:
        why = "by the memory plan vLLM's share of the device does not fit beside training"
    log.info("rollout.engine auto: %s (%s)", engine, why)
    return with_engine(spec, engine)
