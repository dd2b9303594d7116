"""Truncated importance sampling (TIS) for the mismatch between rollout and training log-probs.

The rollout engine samples with its own kernels and precision, so its log-probs differ from the
training engine's recomputed `old_logprobs` for the very same tokens. The policy gradient is an
expectation under the training policy, but the samples come from the rollout policy; weighting
each token (or each response) by the ratio π_train / π_rollout, capped from above so that a few
outliers cannot dominate the batch, corrects most of that bias at bounded variance (TIS, Yao et
al. 2025; verl's `rollout_is`, TRL's `vllm_importance_sampling_correction`).

Everything is computed in float64 and in log space, with the log-ratio capped at log(cap)
before `exp`, so no ratio can overflow however far apart the two engines are.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from rl_core.algos._registry import lookup
from rl_core.algos.kl import kl_k3
from rl_core.algos.masked import masked_mean, masked_sum

ROLLOUT_IS_MODES = ("off", "token", "sequence")

LogRatioFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _token_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token log-ratio, (B, R) -> (B, R)."""
    return log_ratio


def _sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The response's summed log-ratio (log of the product of token ratios) on every token."""
    return masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)


_LOG_RATIO_FNS: dict[str, LogRatioFn | None] = {
    "off": None,
    "token": _token_log_ratio,
    "sequence": _sequence_log_ratio,
}


def _masked_max(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Max of `values` where `mask` is set; 0.0 for an empty mask."""
    return values[mask].max().item() if mask.any() else 0.0


def _masked_min(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Min of `values` where `mask` is set; 0.0 for an empty mask."""
    return values[mask].min().item() if mask.any() else 0.0


@torch.no_grad()
def rollout_is_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    cap: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Capped importance weights π_train / π_rollout and mismatch metrics.

    old_logprobs (training engine), rollout_logprobs (rollout engine), response_mask (B, R) ->
    weights (B, R) float32, detached, and a dict of floats. With d_t = old_t - rollout_t:
    - `token`: w_t = min(exp(d_t), cap);
    - `sequence`: w = min(exp(Σ_t d_t), cap) over the response, on each of its tokens;
    - `off`: w = 1, and only the mismatch metrics.
    Weights are 0 on padding in every mode (1 on every response token with `off`), so a weighted
    tensor keeps zeros where the mask has them; values at padding are never read.

    Metrics: `rollout/logprob_diff/mean` and `/max` (|d_t| over response tokens),
    `rollout/kl/k1` and `/k3` (estimates of KL(π_rollout ‖ π_train), the samples being drawn from
    the rollout policy). Except with `off`: `rollout/is_weight/mean`, `/min`, `/max` (over
    response tokens, after the cap), `rollout/is_weight/truncated_frac` (share of response tokens,
    or of non-empty rows with `sequence`, whose raw ratio exceeded the cap) and
    `rollout/is_weight/ess` (effective sample size (Σw)² / (n·Σw²) of the capped weights over the
    same units, in [0, 1]; 1 when all weights are equal, 0 when none is positive).
    """
    log_ratio_fn = lookup(_LOG_RATIO_FNS, mode, "rollout_is mode")
    if not cap >= 1:  # also rejects NaN
        raise ValueError(
            f"actor.rollout_is_cap must be >= 1, got {cap}: the cap bounds the weights from "
            "above, so a value below 1 would shrink every token; set it to e.g. 2.0"
        )
    if not old_logprobs.shape == rollout_logprobs.shape == response_mask.shape:
        raise ValueError(
            "old_logprobs, rollout_logprobs and response_mask must have one shape, got "
            f"{tuple(old_logprobs.shape)}, {tuple(rollout_logprobs.shape)} and "
            f"{tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    mask_f = mask.to(torch.float64)
    # where, not multiply: padding may hold -inf or NaN, and NaN * 0 is NaN
    diff = torch.where(mask, old_logprobs.double() - rollout_logprobs.double(), 0.0)  # (B, R)
    metrics = {
        "rollout/logprob_diff/mean": masked_mean(diff.abs(), mask_f).item(),
        "rollout/logprob_diff/max": _masked_max(diff.abs(), mask),
        "rollout/kl/k1": masked_mean(-diff, mask_f).item(),
        "rollout/kl/k3": masked_mean(kl_k3(torch.zeros_like(diff), diff), mask_f).item(),
    }
    if log_ratio_fn is None:
        return mask.to(torch.float32), metrics

    log_ratio = log_ratio_fn(diff, mask_f)  # (B, R)
    log_cap = math.log(cap)
    weights = torch.where(mask, torch.exp(log_ratio.clamp(max=log_cap)), 0.0)  # (B, R)
    truncated = log_ratio > log_cap  # (B, R)
    if mode == "sequence":  # one weight per response: count rows, not tokens
        units = mask.any(dim=-1)  # (B,) the non-empty responses
        unit_weights = weights.amax(dim=-1)  # (B,) each response's one weight
        unit_truncated = (truncated & mask).any(dim=-1)  # (B,)
    else:
        units, unit_weights, unit_truncated = mask, weights, truncated
    n_units = units.sum().clamp(min=1)
    sum_w = unit_weights[units].sum()
    sum_w2 = (unit_weights[units] ** 2).sum()
    metrics.update(
        {
            "rollout/is_weight/mean": masked_mean(weights, mask_f).item(),
            "rollout/is_weight/min": _masked_min(weights, mask),
            "rollout/is_weight/max": _masked_max(weights, mask),
            "rollout/is_weight/truncated_frac": ((unit_truncated & units).sum() / n_units).item(),
            "rollout/is_weight/ess": (sum_w**2 / (n_units * sum_w2)).item() if sum_w2 > 0 else 0.0,
        }
    )
    return weights.to(torch.float32), metrics
