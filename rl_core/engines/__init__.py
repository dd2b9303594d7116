"""Training and rollout engines, each implementing one Protocol (`rl_core.engines.base`) and
chosen by name from the spec: `actor.strategy` names the training engine, `rollout.engine` the
rollout engine. Names the spec accepts but no engine implements yet are refused by the spec
(`rl_core.spec.NOT_IMPLEMENTED`).

    engine_class = training_engine("torch")        # rl_core.engines.train.TrainEngine
    engine_class = training_engine("fsdp2")        # rl_core.engines.fsdp.FSDP2Engine (sharded)
    rollout_class = rollout_engine("native")       # rl_core.engines.rollout.NativeRolloutEngine
    rollout_class = rollout_engine("vllm")         # rl_core.engines.vllm_rollout (vLLM in process)
"""

from __future__ import annotations

import importlib
from typing import Any

from rl_core.errors import InputError

# name -> "module:class"; imported on first use (engines import torch and their backends)
TRAINING_ENGINES = {"torch": "rl_core.engines.train:TrainEngine",
                    "fsdp2": "rl_core.engines.fsdp:FSDP2Engine"}
ROLLOUT_ENGINES = {"native": "rl_core.engines.rollout:NativeRolloutEngine",
                   "vllm": "rl_core.engines.vllm_rollout:VLLMRolloutEngine"}


def _load(table: dict[str, str], name: str, field: str) -> Any:
    if name not in table:
        raise InputError(f"{field}: no engine named {name!r}; choose one of {', '.join(table)}")
    module, cls = table[name].split(":")
    return getattr(importlib.import_module(module), cls)


def training_engine(name: str) -> Any:
    """The training engine class of `actor.strategy`."""
    return _load(TRAINING_ENGINES, name, "actor.strategy")


def rollout_engine(name: str) -> Any:
    """The rollout engine class of `rollout.engine`."""
    return _load(ROLLOUT_ENGINES, name, "rollout.engine")
