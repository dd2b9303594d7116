"""Recipes: the entry points of training, each composed of rl_core's components.

    summary = run(spec, backend="local")     # the recipe of spec.algorithm

| recipe | algorithms | module |
| --- | --- | --- |
| RL | grpo, dapo, ppo (and the estimator variants: Dr.GRPO, RLOO, REINFORCE++, GSPO) | `rl` |
| DPO | dpo | `dpo` |
| SFT | the warm start (`python -m rl_core sft`) | `sft` |
| evaluation | a checkpoint on a dataset (`python -m rl_core eval`) | `eval` |

A recipe is self-contained: it builds what it needs from components (`rl_core.controller`,
`roles`, `engines`, `algos`, `data`, `rewards`, `models`) and subclasses no other recipe. Nothing
outside `rl_core.recipes`, the command line (`rl_core.cli`) and `__main__` imports a recipe.
"""

from __future__ import annotations

import importlib
from typing import Any

from rl_core.errors import InputError

# algorithm -> "module:class" (imported on use: recipes import torch)
RECIPES = {
    "grpo": "rl_core.recipes.rl:RLTrainer",
    "dapo": "rl_core.recipes.rl:RLTrainer",
    "ppo": "rl_core.recipes.rl:RLTrainer",
    "dpo": "rl_core.recipes.dpo:DPOTrainer",
}


def recipe(algorithm: str) -> Any:
    """The recipe class that trains `algorithm`."""
    if algorithm not in RECIPES:
        raise InputError(f"algorithm: no recipe trains {algorithm!r}; choose one of "
                         f"{', '.join(RECIPES)}")
    module, name = RECIPES[algorithm].split(":")
    return getattr(importlib.import_module(module), name)


def run(spec, backend: str = "local", **options: Any) -> dict[str, float]:
    """Train `spec` with its algorithm's recipe; returns the last logged metrics."""
    return recipe(spec.algorithm)(spec, backend=backend, **options).fit()
