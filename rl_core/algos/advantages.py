"""Advantage estimators: GRPO, Dr. GRPO, RLOO, REINFORCE++ (with and without baseline), GAE.

Every estimator returns `(advantages, returns)`, both (B, T), zero on padding. Outcome-reward
estimators score a response by the sum of its token rewards; `index` (B,) holds group labels
(prompt uids, as a tensor or a sequence of hashables): responses with equal labels answer the
same prompt. Padding positions of `token_level_rewards` and `values` are ignored.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from rl_core.algos._registry import lookup
from rl_core.algos.masked import group_ids, group_stats, masked_whiten

Index = torch.Tensor | Sequence[Any]
AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return (token_level_rewards * response_mask).sum(-1)  # (B,)


def _broadcast(per_seq: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_seq.unsqueeze(-1) * response_mask  # (B,) -> (B, T)


@torch.no_grad()
def grpo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Index,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantage: (score - group mean) / (group std + epsilon).

    token_level_rewards, response_mask (B, T); index (B,) -> advantages = returns (B, T).
    The std is unbiased; `norm_adv_by_std=False` skips the division (Dr. GRPO). A group of one
    response has no baseline and gets advantage 0.
    """
    scores = _outcome_scores(token_level_rewards, response_mask)
    count, mean, std = group_stats(scores, group_ids(index, scores.device))
    adv = scores - mean
    if norm_adv_by_std:
        adv = adv / (std + epsilon)
    adv = torch.where(count > 1, adv, torch.zeros_like(adv))
    adv = _broadcast(adv, response_mask)
    return adv, adv


@torch.no_grad()
def dr_grpo(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Index
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr. GRPO: score - group mean, without the std division (shapes as `grpo`)."""
    return grpo(token_level_rewards, response_mask, index, norm_adv_by_std=False)


@torch.no_grad()
def rloo(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Index
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: score minus the mean score of the other responses of its group.

    token_level_rewards, response_mask (B, T); index (B,) -> advantages = returns (B, T).
    A group of one gets advantage 0.
    """
    scores = _outcome_scores(token_level_rewards, response_mask)
    count, mean, _ = group_stats(scores, group_ids(index, scores.device))
    # score - (n·mean - score)/(n - 1) = n/(n - 1) · (score - mean)
    adv = (scores - mean) * count / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, adv, torch.zeros_like(adv))
    adv = _broadcast(adv, response_mask)
    return adv, adv


def discounted_returns(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> torch.Tensor:
    """Return-to-go over valid tokens: G_t = r_t + gamma·G_next, (B, T) -> (B, T).

    G_next is the return at the next valid token; masked positions are skipped (they neither add
    reward nor discount) and get 0.
    """
    returns = torch.zeros_like(token_level_rewards)
    running = token_level_rewards.new_zeros(token_level_rewards.shape[0])  # (B,)
    for t in reversed(range(token_level_rewards.shape[-1])):
        valid = response_mask[:, t] > 0
        running = torch.where(valid, token_level_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return returns * response_mask


@torch.no_grad()
def reinforce_plus_plus(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted token returns, whitened over the valid tokens of the batch.

    token_level_rewards, response_mask (B, T) -> advantages, returns (B, T).
    """
    returns = discounted_returns(token_level_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask) * response_mask, returns


@torch.no_grad()
def reinforce_plus_plus_baseline(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Index
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with baseline: score minus group mean, broadcast, whitened over the batch.

    token_level_rewards, response_mask (B, T); index (B,) -> advantages = returns (B, T).
    A group of one is its own baseline (0 before whitening).
    """
    scores = _outcome_scores(token_level_rewards, response_mask)
    _, mean, _ = group_stats(scores, group_ids(index, scores.device))
    adv = _broadcast(scores - mean, response_mask)
    adv = masked_whiten(adv, response_mask) * response_mask
    return adv, adv


@torch.no_grad()
def gae(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the valid tokens of each response.

    token_level_rewards, response_mask, values (B, T) -> advantages, returns (B, T).
    delta_t = r_t + gamma·V_next - V_t and A_t = delta_t + gamma·lam·A_next, where "next" is the
    next valid token (0 after the last). Returns are the raw A + V; the advantages are whitened
    over the batch's valid tokens.
    """
    B, T = token_level_rewards.shape
    adv = torch.zeros_like(token_level_rewards)
    next_value = values.new_zeros(B)  # (B,)
    next_adv = values.new_zeros(B)  # (B,)
    for t in reversed(range(T)):
        valid = response_mask[:, t] > 0
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        cur = delta + gamma * lam * next_adv
        next_adv = torch.where(valid, cur, next_adv)
        next_value = torch.where(valid, values[:, t], next_value)
        adv[:, t] = cur
    returns = (adv + values) * response_mask
    return masked_whiten(adv, response_mask) * response_mask, returns


ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_plus_plus": reinforce_plus_plus,
    "reinforce_plus_plus_baseline": reinforce_plus_plus_baseline,
    "gae": gae,
}


# Keyword options taken by at least one estimator.
_OPTIONS = {
    name
    for fn in ADVANTAGE_ESTIMATORS.values()
    for name in list(inspect.signature(fn).parameters)[2:]
} - {"index", "values"}


def get_advantage_estimator(name: str) -> AdvantageFn:
    """The estimator called `name` (spec `adv_estimator`); UnknownNameError lists valid names."""
    return lookup(ADVANTAGE_ESTIMATORS, name, "adv_estimator")


def compute_advantage(
    name: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    index: Index | None = None,
    values: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call estimator `name` with the inputs and options (gamma, lam, epsilon, norm_adv_by_std)
    it takes; the others are ignored, so one call site serves every estimator.

    Raises ValueError when the estimator needs `index` or `values` and they are missing, and
    TypeError for an option no estimator takes.
    """
    fn = get_advantage_estimator(name)
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"unknown advantage options {unknown}: valid are {sorted(_OPTIONS)}")
    accepted = inspect.signature(fn).parameters
    given = {"index": index, "values": values, **options}
    for needed in ("index", "values"):
        if needed in accepted and given[needed] is None:
            raise ValueError(f"adv_estimator {name!r} needs `{needed}`")
    kwargs = {k: v for k, v in given.items() if k in accepted}
    return fn(token_level_rewards, response_mask, **kwargs)
