"""The training engine's interface: what it must offer the roles (the rollout engine's is
rl_core.rollout.base).

A training engine owns a model's optimizer on a device (plain PyTorch, FSDP2). The roles only
call these methods, so a new engine is a new implementation registered by name in
`rl_core.engines` (`actor.strategy`) and nothing else changes.

Weights travel from a training engine to a rollout engine as an iterator of buckets, each a
list of (name, tensor) pairs of at most about `bucket_bytes`, so the whole model is never
copied at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from rl_core.errors import InputError

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


def in_buckets(weights: Iterable[tuple[str, torch.Tensor]],
               bucket_bytes: int) -> Iterator[WeightBucket]:
    """(name, tensor) pairs, as they come, in buckets of at most about `bucket_bytes` (a
    larger tensor is a bucket of its own)."""
    bucket: WeightBucket = []
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers to shard one by one (`model.model.layers` of a Hugging Face causal LM
    or token classifier, `model.model.language_model.layers` of a vision-language model, whose
    vision tower stays with the root; a PEFT-wrapped model's base's); an InputError when the
    model has none there."""
    if hasattr(model, "get_base_model"):  # LoRA adapters around the model (actor.lora)
        model = model.get_base_model()
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    if layers is None:
        layers = getattr(getattr(body, "language_model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        raise InputError(f"model: cannot find the decoder layers of {type(model).__name__} to "
                         "shard with FSDP2 (expected model.model.layers); use actor.strategy=torch")
    return list(layers)
