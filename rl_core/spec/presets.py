"""The presets: what each algorithm's spec starts from before the user's values."""

from __future__ import annotations

from typing import Any

# --------------------------------------------------------------------------- presets

PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {
        "advantage": {"adv_estimator": "grpo"},
        "actor": {"use_kl_loss": True, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.001},
        "reference": {"enable": True},
        "critic": {"enable": False},
        "rollout": {"n_samples_per_prompt": 4},
    },
    "dapo": {
        "advantage": {
            "adv_estimator": "grpo",
            "overlong_buffer": {"enable": True},
            "dynamic_sampling": {"enable": True},
        },
        "actor": {
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.28,
            "loss_agg_mode": "token-mean",
            "use_kl_loss": False,
        },
        "reference": {"enable": False},
        "critic": {"enable": False},
        "rollout": {"n_samples_per_prompt": 4},
    },
    "ppo": {
        "advantage": {"adv_estimator": "gae"},
        "actor": {"use_kl_loss": False},
        "reference": {"enable": False},
        "critic": {"enable": True},
        "rollout": {"n_samples_per_prompt": 1},
    },
    "dpo": {
        "advantage": {"adv_estimator": None},
        "actor": {"use_kl_loss": False},
        "dpo": {"beta": 0.1, "loss_type": "sigmoid"},
        "reference": {"enable": True},
        "critic": {"enable": False},
        "rollout": {"n_samples_per_prompt": 2},
    },
}
