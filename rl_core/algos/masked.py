"""Masked reductions, whitening and group ids shared by the loss and advantage functions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

WHITEN_EPS = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is 1; over all elements, or along `dim`."""
    masked = values * mask
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 (not NaN) where the mask is empty."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked elements (scalar); Bessel-corrected when `unbiased` and n > 1."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        var = var * n / (n - 1).clamp(min=1)
    return var


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True
) -> torch.Tensor:
    """(values - mean) / std over the masked elements; the mean is added back unless `shift_mean`.

    Shapes: values, mask (...) -> (...). Elements outside the mask are transformed too (callers
    zero them); an empty mask gives finite values.
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + WHITEN_EPS)
    return whitened if shift_mean else whitened + mean


def group_ids(
    index: torch.Tensor | Sequence[Any], device: torch.device | None = None
) -> torch.Tensor:
    """Dense group ids 0..G-1 (B,) from group labels (B,): a tensor, or any sequence of hashables.

    Labels are e.g. prompt uids (strings, as in verl's `uid` array) or integers; equal labels are
    one group.
    """
    if isinstance(index, torch.Tensor):
        return torch.unique(index, return_inverse=True)[1].to(device or index.device)
    labels = index.tolist() if hasattr(index, "tolist") else list(index)  # numpy arrays too
    first_seen: dict[Any, int] = {}
    ids = [first_seen.setdefault(label, len(first_seen)) for label in labels]
    return torch.tensor(ids, dtype=torch.long, device=device)


def group_stats(
    scores: torch.Tensor, gid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-element size, mean and unbiased std of its group: scores, gid (B,) -> 3 × (B,).

    The std of a group of one is 0.
    """
    n_groups = int(gid.max()) + 1 if gid.numel() else 0
    zeros = scores.new_zeros(n_groups)
    count = zeros.index_add(0, gid, torch.ones_like(scores))  # (G,)
    mean = zeros.index_add(0, gid, scores) / count.clamp(min=1)  # (G,)
    sq_dev = zeros.index_add(0, gid, (scores - mean[gid]) ** 2)  # (G,)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    return count[gid], mean[gid], std[gid]
