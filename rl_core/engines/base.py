"""The engine interfaces: what a training engine and a rollout engine must offer the roles.

A training engine owns a model's optimizer on a device (plain PyTorch today, FSDP2 next); a
rollout engine generates responses from prompts (the native decoder today, vLLM next). The
roles only call these methods, so a new engine is a new implementation registered by name in
`rl_core.engines` (`actor.strategy`, `rollout.engine`) and nothing else changes.

Weights travel from a training engine to a rollout engine as an iterator of buckets, each a
list of (name, tensor) pairs of at most about `bucket_bytes`, so the whole model is never
copied at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from rl_core.data.batch import Batch

# loss_fn(micro, outputs (b, R), entropy (b, R) | None) -> (scalar loss, metrics)
LossFn = Callable[[dict[str, Any], torch.Tensor, "torch.Tensor | None"],
                  tuple[torch.Tensor, Mapping[str, Any]]]
WeightBucket = list[tuple[str, torch.Tensor]]


@runtime_checkable
class TrainingEngine(Protocol):
    """A model, its optimizer and its schedule on one device (or a sharded group of them)."""

    model: torch.nn.Module
    dp_group: Any

    def forward_logprobs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         position_ids: torch.Tensor, response_len: int, temperature: float = 1.0,
                         micro_batch_size: int | None = None, with_entropy: bool = False,
                         grad: bool = False, max_token_len: int | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head's outputs over the last `response_len` columns (log-probs, or values for a
        value head) (B, R), and the entropy (B, R) when asked."""

    def train_step(self, batch: Mapping[str, Any], loss_fn: LossFn, **options: Any) -> dict[str, float]:
        """One optimizer step over a mini-batch (micro-batched), returning its metrics."""

    def state_dict(self) -> dict[str, Any]:
        """Optimizer and schedule state for a checkpoint (the weights are the model's)."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    def weight_buckets(self, bucket_bytes: int = ...) -> Iterator[WeightBucket]:
        """The full weights, bucket by bucket, for a rollout engine."""

    def offload(self) -> None:
        """Move parameters, gradients and optimizer state to host memory."""

    def reload(self) -> None:
        """Bring them back to the device."""


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
