"""Tensor parallelism for the native rollout (`rollout.tensor_parallel_size`): each rank of a
rollout group of `size` ranks holds its part of every decoder layer and generates with the
group, the same prompts on every rank of it.

    model = split_layers(full_model, rank, size)           # in place, on the host
    engine = NativeRolloutEngine(model.to(device), ..., group=rollout_group)
    engine.load_weights(training_engine.weight_buckets())  # each rank keeps its parts

A rank keeps the rows of q, k, v, gate and up that make its heads and its share of the MLP
width (`COLUMN_SPLIT`, with their biases) and the matching columns of o and down (`ROW_SPLIT`);
the embedding, the norms and the LM head stay whole. The fast decoder then computes each layer
on the rank's heads and width and sums the output and down projections over the group (one
all-reduce each, a layer), so every rank holds the same hidden states, logits and sampled tokens
(the same draws). The biases of o and down are added once, by the group's first rank.

Weights arrive from the training engine in full, bucket by bucket (whatever its layout), and
each rank copies its part of each (`part_of`): no rank ever holds the full model, only one
bucket of it at a time. Where training is split the same way (`parallel.resharding: none`:
training's tensor-parallel blocks are the rollout groups), the split weights (`is_split`) come
as this rank's part already, gathered over the FSDP2 shards only.
"""

from __future__ import annotations

import torch

from rl_core.errors import InputError

FIELD = "rollout.tensor_parallel_size"
COLUMN_SPLIT = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # output rows split
ROW_SPLIT = ("o_proj", "down_proj")  # input columns split


def part_of(name: str, tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """The part of weight `name` (a Hugging Face state-dict name, the full tensor) that rank
    `rank` of a rollout group of `size` holds: a view, or a zero bias on ranks after the
    first for a row-split projection."""
    if size == 1:
        return tensor
    pieces = name.split(".")
    module, kind = (pieces[-2] if len(pieces) > 1 else ""), pieces[-1]
    if module in COLUMN_SPLIT:
        return tensor.chunk(size, 0)[rank]
    if module in ROW_SPLIT:
        if kind == "bias":
            return tensor if rank == 0 else torch.zeros_like(tensor)
        return tensor.chunk(size, 1)[rank]
    return tensor


def is_split(name: str) -> bool:
    """Whether weight `name` is split over a rollout group (a layer's projection weight, and
    the biases of the column-split ones): with `parallel.resharding: none` training gives
    these already split in the same layout."""
    pieces = name.split(".")
    module, kind = (pieces[-2] if len(pieces) > 1 else ""), pieces[-1]
    return module in COLUMN_SPLIT or (module in ROW_SPLIT and kind == "weight")


def check_split(config, size: int) -> None:
    """An InputError naming the field when `size` ranks cannot share the model's heads,
    key/value heads or MLP width."""
    for what, key in (("attention heads", "num_attention_heads"),
                      ("key/value heads", "num_key_value_heads"),
                      ("MLP intermediate size", "intermediate_size")):
        count = getattr(config, key, None)
        if size > 1 and count is not None and count % size:
            raise InputError(f"{FIELD}: {size} does not divide the model's {count} {what} "
                             f"(each rank of a rollout group decodes an equal share): pick a "
                             f"divisor of {count}")


def split_layers(model: torch.nn.Module, rank: int, size: int) -> torch.nn.Module:
    """Keep rank `rank`'s part of every decoder layer of `model` (in place; `part_of`). The
    model's config is left as it was (the full model's): only the fast decoder runs the
    parts, and it reads the heads from the weights' shapes."""
    check_split(model.config, size)
    if size == 1:
        return model
    with torch.no_grad():
        for prefix, module in model.named_modules():
            short = prefix.rsplit(".", 1)[-1]
            if not isinstance(module, torch.nn.Linear) or short not in COLUMN_SPLIT + ROW_SPLIT:
                continue
            for kind in ("weight", "bias"):
                value = getattr(module, kind)
                if value is not None:
                    part = part_of(f"{prefix}.{kind}", value.detach(), rank, size)
                    setattr(module, kind, torch.nn.Parameter(part.clone(),
                                                             requires_grad=False))
            module.out_features, module.in_features = module.weight.shape
    return model
