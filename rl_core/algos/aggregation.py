"""Loss aggregation: how a (B, T) matrix of token losses becomes one scalar."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rl_core.algos._registry import lookup
from rl_core.algos.masked import masked_mean, masked_sum

AggFn = Callable[[torch.Tensor, torch.Tensor, "int | None"], torch.Tensor]


def _seq_mean(seq_losses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of per-sequence losses (B,) over the sequences with at least one valid token."""
    has_tokens = (mask.sum(-1) > 0).to(seq_losses.dtype)  # (B,)
    return masked_mean(seq_losses, has_tokens)


def token_mean(
    loss_mat: torch.Tensor, mask: torch.Tensor, norm_len: int | None = None
) -> torch.Tensor:
    """Mean over all valid tokens of the batch (longer responses weigh more)."""
    return masked_mean(loss_mat, mask)


def seq_mean_token_mean(
    loss_mat: torch.Tensor, mask: torch.Tensor, norm_len: int | None = None
) -> torch.Tensor:
    """Mean over sequences of each sequence's mean token loss (original GRPO)."""
    return _seq_mean(masked_mean(loss_mat, mask, dim=-1), mask)


def seq_mean_token_sum(
    loss_mat: torch.Tensor, mask: torch.Tensor, norm_len: int | None = None
) -> torch.Tensor:
    """Mean over sequences of each sequence's summed token loss."""
    return _seq_mean(masked_sum(loss_mat, mask, dim=-1), mask)


def seq_mean_token_sum_norm(
    loss_mat: torch.Tensor, mask: torch.Tensor, norm_len: int | None = None
) -> torch.Tensor:
    """Mean over sequences of token sums divided by a constant horizon (Dr. GRPO).

    The horizon is `norm_len` when given (e.g. the maximum response length), else T, so the
    divisor does not depend on how long the responses happen to be.
    """
    horizon = loss_mat.shape[-1] if norm_len is None else norm_len
    return _seq_mean(masked_sum(loss_mat, mask, dim=-1) / horizon, mask)


LOSS_AGG_MODES: dict[str, AggFn] = {
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum": seq_mean_token_sum,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}


def get_loss_agg_mode(name: str) -> AggFn:
    """The aggregation function called `name`; UnknownNameError lists the valid names."""
    return lookup(LOSS_AGG_MODES, name, "loss_agg_mode")


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    norm_len: int | None = None,
) -> torch.Tensor:
    """Aggregate token losses: loss_mat, mask (B, T) -> scalar, by `mode` (see LOSS_AGG_MODES).

    Sequence means count only sequences with a valid token; an empty mask gives 0, not NaN.
    `norm_len` is the constant horizon of `seq-mean-token-sum-norm` (default T).
    """
    if norm_len is not None and norm_len <= 0:
        raise ValueError(f"norm_len must be positive, got {norm_len}")
    return get_loss_agg_mode(mode)(loss_mat, mask, norm_len)
