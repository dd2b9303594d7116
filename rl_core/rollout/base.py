"""The rollout engine's interface: what the roles call (implementations: rl_core.rollout.native,
rl_core.rollout.vllm). A new engine is registered by name in `rl_core.rollout`
(`rollout.engine`) and nothing else changes. Weights arrive from a training engine as buckets
(`rl_core.engines.base.WeightBucket`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from rl_core.data.batch import Batch
from rl_core.engines.base import WeightBucket


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates responses to prompts into the batch container (`ROLLOUT_COLUMNS`)."""

    def generate(self, prompts: Sequence[Sequence[int]], params: Any,
                 generator: torch.Generator | None = None, *,
                 uniforms: torch.Tensor | None = None) -> Batch:
        """`params.n` responses to each prompt (token ids), a prompt's rows adjacent."""

    def load_weights(self, buckets: Iterable[WeightBucket]) -> None:
        """Take new weights from a training engine's `weight_buckets`."""

    def free_cache(self) -> None:
        """Release the KV cache (before a training update on the same devices)."""

    def sleep(self) -> None:
        """Release what the engine holds on the device while training runs (where it can)."""

    def wake_up(self) -> None: ...
