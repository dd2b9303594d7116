"""Clipped value (critic) loss for PPO."""

from __future__ import annotations

import torch

from rl_core.algos.aggregation import agg_loss
from rl_core.algos.masked import masked_mean


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float = 0.5,
    agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """½·max((V - R)², (clip(V, V_old ± cliprange_value) - R)²), aggregated by `agg_mode`.

    values (new predictions), old_values (at rollout), returns, mask (B, T) -> scalar loss and
    metrics {`vf_clipfrac`: share of valid tokens where the clipped term is the larger}.
    """
    # clamp the values themselves: inside the range they stay bit for bit what they are, so the
    # clip fraction counts clipped tokens, not the rounding of old + (new - old)
    clipped_values = torch.clamp(values, old_values - cliprange_value,
                                 old_values + cliprange_value)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped_values - returns) ** 2
    loss = 0.5 * agg_loss(torch.maximum(unclipped_loss, clipped_loss), mask, agg_mode)
    clipfrac = masked_mean((clipped_loss > unclipped_loss).float(), mask)
    return loss, {"vf_clipfrac": clipfrac.detach()}
