"""A short seeded run that must learn: SFT to a partial base, then GRPO raises validation accuracy."""

from __future__ import annotations

from pathlib import Path

from learning import learning_spec, rose, validation_gain

from rl_core.recipes.rl import RLTrainer
from rl_core.spec import resolve_spec


def test_grpo_raises_validation_accuracy_over_an_sft_base(tmp_path: Path, sft_base):
    out = tmp_path / "grpo"
    RLTrainer(resolve_spec(learning_spec("grpo", sft_base, out, 20, actor={
        "ppo_micro_batch_size": 128}))).fit()
    before, after = validation_gain(out)
    assert 0.0 < before < 0.9, f"the SFT base should be right only part of the time, got {before}"
    assert rose(before, after), f"validation accuracy did not rise: {before} -> {after}"
