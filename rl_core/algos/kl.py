"""KL(policy ‖ reference) estimators, as a loss term or an in-reward penalty, and KL controllers."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl_core.algos._registry import lookup
from rl_core.algos.aggregation import agg_loss
from rl_core.algos.masked import masked_mean

KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

K3_LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


def kl_k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k1 = log π - log π_ref per token, (B, T) -> (B, T); unbiased, high variance, signed."""
    return log_prob - ref_log_prob


def kl_abs(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """|log π - log π_ref| per token, (B, T) -> (B, T)."""
    return (log_prob - ref_log_prob).abs()


def kl_k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log π - log π_ref)² per token, (B, T) -> (B, T) (alias `mse`)."""
    return 0.5 * (log_prob - ref_log_prob) ** 2


def kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k3 = exp(d) - d - 1 with d = log π_ref - log π, per token, (B, T) -> (B, T).

    Alias `low_var_kl` (Schulman's low-variance estimator; always >= 0). d is clamped to ±20
    and the result to [-10, 10], so extreme log-ratios stay finite.
    """
    d = (ref_log_prob - log_prob).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(d) - d - 1).clamp(-K3_CLAMP, K3_CLAMP)


KL_ESTIMATORS: dict[str, KLFn] = {
    "k1": kl_k1,
    "abs": kl_abs,
    "k2": kl_k2,
    "mse": kl_k2,
    "k3": kl_k3,
    "low_var_kl": kl_k3,
}


def get_kl_estimator(name: str) -> KLFn:
    """The KL estimator called `name` (spec `kl_loss_type` / `kl_penalty`)."""
    return lookup(KL_ESTIMATORS, name, "KL estimator")


def kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_loss_type: str = "low_var_kl",
    loss_agg_mode: str = "token-mean",
    norm_len: int | None = None,
) -> torch.Tensor:
    """The KL loss term: log_prob, ref_log_prob, response_mask (B, T) -> scalar.

    `norm_len` is the fixed horizon of `seq-mean-token-sum-norm` (as for the policy loss), so
    the term does not depend on how wide the batch is padded."""
    kld = get_kl_estimator(kl_loss_type)(log_prob, ref_log_prob)
    return agg_loss(kld, response_mask, loss_agg_mode, norm_len=norm_len)


@torch.no_grad()
def apply_kl_penalty(
    token_rewards: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    coef: float,
    estimator: str = "k1",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Subtract coef·KL from each valid token's reward (in-reward KL, PPO-RLHF style).

    token_rewards, log_prob, ref_log_prob, response_mask (B, T) -> penalised rewards (B, T) and
    the batch's KL (scalar: the mean over sequences of each sequence's mean token KL), which is
    what `AdaptiveKLController.update` expects.
    """
    kld = get_kl_estimator(estimator)(log_prob, ref_log_prob) * response_mask  # (B, T)
    rewards = token_rewards - coef * kld
    current_kl = masked_mean(kld, response_mask, dim=-1).mean()
    return rewards, current_kl


class FixedKLController:
    """A constant KL coefficient; `update` does nothing."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep the coefficient."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al., 2019): moves the KL toward `target`.

    value ← value · (1 + clip(KL/target - 1, -0.2, 0.2) · n_steps / horizon).
    """

    def __init__(self, kl_coef: float, target: float, horizon: int):
        if target <= 0 or horizon <= 0:
            raise ValueError(f"target and horizon must be positive, got {target}, {horizon}")
        self.value = kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adapt after `n_steps` samples (or steps) observed at mean KL `current_kl`."""
        error = min(max(float(current_kl) / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * n_steps / self.horizon


KL_CONTROLLERS: dict[str, type] = {"fixed": FixedKLController, "adaptive": AdaptiveKLController}


def make_kl_controller(
    kind: str, kl_coef: float, target: float = 0.1, horizon: int = 10000
) -> FixedKLController | AdaptiveKLController:
    """A controller of `kind` (spec `kl_ctrl`) from kl_coef, kl_target and kl_horizon."""
    cls = lookup(KL_CONTROLLERS, kind, "kl_ctrl")
    return cls(kl_coef) if cls is FixedKLController else cls(kl_coef, target, horizon)
