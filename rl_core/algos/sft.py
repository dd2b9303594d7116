"""The supervised warm start's loss (the SFT recipe, rl_core.recipes.sft)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rl_core.algos.masked import masked_mean


def sft_loss_fn(
    micro: Mapping[str, Any], logprobs: torch.Tensor, entropy: torch.Tensor | None
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Supervised warm-start loss: NLL of the response tokens, token-mean (use with the
    engine's `loss_agg_mode="token-mean"`). logprobs, micro["response_mask"] (b, R) -> scalar,
    and its metric `actor/sft_loss`."""
    nll = -masked_mean(logprobs, micro["response_mask"])
    return nll, {"actor/sft_loss": nll.detach()}
