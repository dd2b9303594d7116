"""Policy-gradient losses: PPO clip with clip-higher and dual clip, and GSPO's sequence ratio."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl_core.algos._registry import lookup
from rl_core.algos.aggregation import agg_loss
from rl_core.algos.masked import masked_mean

LOG_RATIO_CLAMP = 20.0  # |log ratio| above this is clamped before exp, keeping the ratio finite

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def ppo_clip_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
    norm_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate with asymmetric clip (DAPO clip-higher) and dual clip.

    old_log_prob, log_prob, advantages, response_mask (B, T) -> scalar loss and metrics.
    Token loss: max(-A·r, -A·clip(r, 1 - low, 1 + high)); for A < 0 it is further capped at
    -A·clip_ratio_c (dual clip), bounding the loss of a token whose ratio exploded.
    Metrics (detached scalars): `pg_clipfrac` (share of tokens where the clip binds),
    `pg_clipfrac_lower` (share where the dual clip binds), `ppo_kl` (mean of -log r).
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be greater than 1, got {clip_ratio_c}")
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)  # (B, T)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    ppo_losses = torch.maximum(unclipped, clipped)
    dual_cap = -advantages * clip_ratio_c
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(ppo_losses, dual_cap), ppo_losses)
    dual_clipped = (ppo_losses > dual_cap) & negative
    metrics = {
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), response_mask),
        "pg_clipfrac_lower": masked_mean(dual_clipped.float(), response_mask),
        "ppo_kl": masked_mean(-log_ratio, response_mask),
    }
    loss = agg_loss(losses, response_mask, loss_agg_mode, norm_len)
    return loss, {k: v.detach() for k, v in metrics.items()}


def gspo_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "seq-mean-token-mean",
    norm_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: clip a sequence-level ratio s = exp(mean over valid tokens of log r).

    Shapes as `ppo_clip_loss`. Per token the ratio is sg[s]·π(y_t)/sg[π(y_t)] (GSPO-token): its
    value is s and its gradient s·∇log π(y_t), so with `seq-mean-token-mean` and one advantage
    per sequence the gradient is the paper's sequence-level GSPO gradient. The paper's clip
    ranges are small (about 3e-4 / 4e-4). No dual clip (`clip_ratio_c` is accepted for a uniform
    signature and unused); `pg_clipfrac_lower` is 0.
    """
    log_ratio = log_prob - old_log_prob  # (B, T)
    seq_log_ratio = masked_mean(log_ratio, response_mask, dim=-1)  # (B,)
    log_s = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # (B, T)
    s = torch.exp(log_s.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -advantages * s
    clipped = -advantages * s.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    losses = torch.maximum(unclipped, clipped)
    metrics = {
        "pg_clipfrac": masked_mean((clipped > unclipped).float(), response_mask),
        "pg_clipfrac_lower": torch.zeros((), device=log_prob.device),
        "ppo_kl": masked_mean(-log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), response_mask),
    }
    loss = agg_loss(losses, response_mask, loss_agg_mode, norm_len)
    return loss, {k: v.detach() for k, v in metrics.items()}


POLICY_LOSSES: dict[str, PolicyLossFn] = {"vanilla": ppo_clip_loss, "gspo": gspo_loss}


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss called `name` (spec `actor.policy_loss`); UnknownNameError lists names."""
    return lookup(POLICY_LOSSES, name, "policy_loss")
