"""A short seeded run that must learn: SFT to a partial base, then GRPO raises validation accuracy."""

from __future__ import annotations

import json
from pathlib import Path

from rl_core.sft import SFTTrainer
from rl_core.spec import resolve_spec
from rl_core.trainer import RLTrainer

DATA = {"synthetic": {"task": "addition", "digits": 1, "num_train": 80, "num_val": 20},
        "prompt_template": "plain", "val_batch_size": 20}


def test_grpo_raises_validation_accuracy_over_an_sft_base(tmp_path: Path, tiny_cache):
    sft = resolve_spec({
        "algorithm": "grpo", "seed": 1, "model": {"path": "tiny:small"},
        "data": {**DATA, "train_batch_size": 32},
        "rollout": {"n_samples_per_prompt": 2, "max_new_tokens": 4},
        "actor": {"lr": 2e-3, "warmup_steps": 10, "ppo_mini_batch_size": 32, "ppo_micro_batch_size": 32},
        "reward": {"functions": [{"name": "exact_match"}]},
        "trainer": {"total_steps": 120, "output_dir": str(tmp_path / "sft"), "logger": []},
    })
    SFTTrainer(sft).fit()
    base = tmp_path / "sft" / "checkpoints" / "step_120"

    grpo = resolve_spec({
        "algorithm": "grpo", "seed": 1, "model": {"path": str(base)},
        "data": {**DATA, "train_batch_size": 16},
        "rollout": {"n_samples_per_prompt": 8, "max_new_tokens": 4},
        "actor": {"lr": 1e-4, "ppo_mini_batch_size": 16, "ppo_micro_batch_size": 128},
        "reward": {"functions": [{"name": "exact_match"}]},
        "trainer": {"total_steps": 20, "eval_every": 20, "output_dir": str(tmp_path / "grpo"),
                    "logger": []},
    })
    RLTrainer(grpo).fit()
    logged = [json.loads(line) for line in (tmp_path / "grpo" / "metrics.jsonl").read_text().splitlines()]
    before, after = logged[0]["val/accuracy"], logged[-1]["val/accuracy"]
    assert logged[0]["step"] == 0 and logged[-1]["step"] == 20
    assert 0.0 < before < 0.9, f"the SFT base should be right only part of the time, got {before}"
    assert after >= before + 0.1, f"validation accuracy did not rise: {before} -> {after}"
