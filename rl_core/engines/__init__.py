"""Training engines, each implementing the `TrainingEngine` Protocol (`rl_core.engines.base`) and
chosen by `actor.strategy`. (Rollout engines are in `rl_core.rollout`.) Names the spec accepts
but no engine implements yet are refused by the spec (`rl_core.spec.NOT_IMPLEMENTED`).

    engine_class = training_engine("torch")        # rl_core.engines.train.TrainEngine
    engine_class = training_engine("fsdp2")        # rl_core.engines.fsdp.FSDP2Engine (sharded)
    engine_class = training_engine("megatron")     # rl_core.engines.megatron.MegatronEngine

The Megatron engine is built from the Hugging Face folder (`MegatronEngine.from_spec(folder,
spec, total_steps)`), not from a loaded model: the roles build it themselves.
"""

from __future__ import annotations

import importlib
from typing import Any

from rl_core.errors import InputError

# name -> "module:class"; imported on first use (engines import torch and their backends)
TRAINING_ENGINES = {"torch": "rl_core.engines.train:TrainEngine",
                    "fsdp2": "rl_core.engines.fsdp:FSDP2Engine",
                    "megatron": "rl_core.engines.megatron:MegatronEngine"}


def load_engine(table: dict[str, str], name: str, field: str) -> Any:
    """The class `table` names `name` ("module:class"), imported now; an InputError naming
    `field` and the choices for an unknown name."""
    if name not in table:
        raise InputError(f"{field}: no engine named {name!r}; choose one of {', '.join(table)}")
    module, cls = table[name].split(":")
    return getattr(importlib.import_module(module), cls)


def training_engine(name: str) -> Any:
    """The training engine class of `actor.strategy`."""
    return load_engine(TRAINING_ENGINES, name, "actor.strategy")
