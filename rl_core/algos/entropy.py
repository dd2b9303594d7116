"""Token entropy and token log-probabilities from logits, computed stably via logsumexp."""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: (B, T, V) -> (B, T).

    H = -Σ p·log p with log p = z - logsumexp(z) from log_softmax, which shifts by the max: no
    log of an underflowed probability, and no cancellation between two large terms when all
    logits are large. Logits must be finite (mask entries with a large negative number, not -inf).
    """
    log_probs = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    return -(log_probs.exp() * log_probs).sum(-1)


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] per position: logits (B, T, V), labels (B, T) -> (B, T)."""
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - torch.logsumexp(logits, dim=-1)
