"""Rollout: generating responses from prompts, beside the training engines (rl_core.engines).

    sampling.py   SamplingParams and the sampling kernels every engine shares
    native.py     NativeRolloutEngine: over the training weights in the same process
    decoder.py    its fast decoder (static KV cache) and the Hugging Face decoder
    vllm.py       VLLMRolloutEngine: vLLM in process
    base.py       the RolloutEngine Protocol the roles call

Engines are chosen by `rollout.engine`:

    rollout_class = rollout_engine("native")       # rl_core.rollout.native.NativeRolloutEngine
    rollout_class = rollout_engine("vllm")         # rl_core.rollout.vllm.VLLMRolloutEngine
"""

from __future__ import annotations

from typing import Any

from rl_core.engines import load_engine

# name -> "module:class"; imported on first use (they import torch and their backends)
ROLLOUT_ENGINES = {"native": "rl_core.rollout.native:NativeRolloutEngine",
                   "vllm": "rl_core.rollout.vllm:VLLMRolloutEngine"}


def rollout_engine(name: str) -> Any:
    """The rollout engine class of `rollout.engine`."""
    return load_engine(ROLLOUT_ENGINES, name, "rollout.engine")
