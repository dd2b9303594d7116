"""Pure RL loss, advantage and KL math: tensor functions and the registries that name them.

Every function takes and returns tensors (shapes in its docstring) and does no I/O, reads no
config and calls no collectives. Variants are chosen by name through the plain dicts below; each
`get_*` raises `UnknownNameError` (a KeyError and a ValueError) listing the valid names.
"""

from rl_core.algos._registry import UnknownNameError
from rl_core.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    compute_advantage,
    discounted_returns,
    get_advantage_estimator,
)
from rl_core.algos.aggregation import LOSS_AGG_MODES, agg_loss, get_loss_agg_mode
from rl_core.algos.dapo import filter_groups, overlong_penalty
from rl_core.algos.dpo import DPO_LOSSES, dpo_loss, get_dpo_loss
from rl_core.algos.entropy import chunked_logprobs, entropy_from_logits, log_probs_from_logits
from rl_core.algos.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_estimator,
    kl_loss,
    make_kl_controller,
)
from rl_core.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten
from rl_core.algos.policy_loss import POLICY_LOSSES, get_policy_loss
from rl_core.algos.rollout_is import ROLLOUT_IS_MODES, rollout_is_weights
from rl_core.algos.value_loss import value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DPO_LOSSES",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "ROLLOUT_IS_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "UnknownNameError",
    "agg_loss",
    "apply_kl_penalty",
    "chunked_logprobs",
    "compute_advantage",
    "discounted_returns",
    "dpo_loss",
    "entropy_from_logits",
    "filter_groups",
    "get_advantage_estimator",
    "get_dpo_loss",
    "get_kl_estimator",
    "get_loss_agg_mode",
    "get_policy_loss",
    "kl_loss",
    "log_probs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "rollout_is_weights",
    "value_loss",
]
