"""Direct preference optimisation losses: sigmoid (with label smoothing), IPO, hinge."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from rl_core.algos._registry import lookup

DPOLossFn = Callable[[torch.Tensor, float, float], torch.Tensor]


def sigmoid_loss(logits: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """-(1-ε)·log σ(β·h) - ε·log σ(-β·h) per pair, (B,) -> (B,) (DPO; conservative DPO for ε>0).

    h = (log π_c - log π_r) - (log π_ref_c - log π_ref_r).
    """
    return -(1 - label_smoothing) * F.logsigmoid(beta * logits) - label_smoothing * F.logsigmoid(
        -beta * logits
    )


def ipo_loss(logits: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """(h - 1/(2β))² per pair, (B,) -> (B,) (IPO; `label_smoothing` unused).

    The IPO paper uses length-averaged log-probs; pass those as the log-probs to follow it.
    """
    return (logits - 1 / (2 * beta)) ** 2


def hinge_loss(logits: torch.Tensor, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """max(0, 1 - β·h) per pair, (B,) -> (B,) (SLiC; `label_smoothing` unused)."""
    return F.relu(1 - beta * logits)


DPO_LOSSES: dict[str, DPOLossFn] = {"sigmoid": sigmoid_loss, "ipo": ipo_loss, "hinge": hinge_loss}


def get_dpo_loss(name: str) -> DPOLossFn:
    """The DPO loss called `name` (spec `dpo.loss_type`); UnknownNameError lists valid names."""
    return lookup(DPO_LOSSES, name, "DPO loss_type")


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    sft_loss_coef: float = 0.0,
    chosen_lengths: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-pair DPO losses from summed response log-probs, each (B,) -> losses (B,), metrics.

    With `sft_loss_coef` > 0 adds sft_loss_coef · (-log π_c / chosen_lengths), the per-token NLL
    of the chosen response; `chosen_lengths` (B,) (valid token counts) is then required.
    Metrics (detached batch means): `rewards/chosen` = β(log π_c - log π_ref_c), `rewards/rejected`,
    `rewards/margins`, `rewards/accuracies` (share with chosen reward > rejected), and `sft_loss`
    when the SFT term is on.
    """
    chosen_logratios = policy_chosen_logps - reference_chosen_logps  # (B,)
    rejected_logratios = policy_rejected_logps - reference_rejected_logps  # (B,)
    losses = get_dpo_loss(loss_type)(chosen_logratios - rejected_logratios, beta, label_smoothing)
    chosen_rewards = beta * chosen_logratios.detach()
    rejected_rewards = beta * rejected_logratios.detach()
    metrics = {
        "rewards/chosen": chosen_rewards.mean(),
        "rewards/rejected": rejected_rewards.mean(),
        "rewards/margins": (chosen_rewards - rejected_rewards).mean(),
        "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean(),
    }
    if sft_loss_coef > 0:
        if chosen_lengths is None:
            raise ValueError("sft_loss_coef > 0 needs chosen_lengths (chosen token counts)")
        nll = -policy_chosen_logps / chosen_lengths.clamp(min=1)  # (B,)
        losses = losses + sft_loss_coef * nll
        metrics["sft_loss"] = nll.detach().mean()
    return losses, metrics
