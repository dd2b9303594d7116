"""GRPO with LoRA adapters (`actor.lora`) on tiny models: it learns the learning tests' task over
the SFT base with the reference computed by the actor (its adapters off, no reference role),
resumes exactly, and its checkpoint holds the merged model, the adapters in PEFT's format and,
with fsdp2, the adapters' sharded state; `rl_core export` writes the merged model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from learning import learning_spec, rose, validation_gain
from test_trainer import read_metrics, tiny_spec

from rl_core import stopping
from rl_core.checkpoint import list_checkpoints
from rl_core.export import export_checkpoint
from rl_core.recipes.rl import RLTrainer
from rl_core.spec import resolve_spec
from rl_core.tracking import stable_metrics

LORA = {"rank": 8, "alpha": 16}


def test_grpo_with_lora_raises_validation_accuracy_over_an_sft_base(tmp_path: Path, sft_base):
    out = tmp_path / "grpo-lora"
    trainer = RLTrainer(resolve_spec(learning_spec("grpo", sft_base, out, 20, actor={
        "lr": 5e-4, "ppo_micro_batch_size": 128, "lora": LORA})))
    assert trainer.ctl.roles.reference is None  # the actor's base is the reference
    trainer.fit()
    before, after = validation_gain(out)
    assert 0.0 < before < 0.9, f"the SFT base should be right only part of the time, got {before}"
    assert rose(before, after), f"validation accuracy did not rise: {before} -> {after}"
    kl = [m["actor/kl_loss"] for m in read_metrics(out) if "actor/kl_loss" in m]
    # the reference must be the base: KL 0 at the first step (to the rounding of a forward in
    # another batch shape: -1.5e-9 on one CPU), then growing
    assert abs(kl[0]) < 1e-6 < max(kl), kl


def _run(base: Path, output_dir: Path, stop_at: int | None = None, **actor) -> RLTrainer:
    spec = resolve_spec(tiny_spec(output_dir, model={"path": str(base)},
                                  actor={"lora": LORA, "lr": 1e-2, **actor},
                                  trainer={"total_steps": 4, "save_every": 2}))
    trainer = RLTrainer(spec)
    if stop_at is not None:  # a stop asked during step `stop_at` saves it and ends the run
        step = trainer.train_step

        def stopping_step():
            if trainer.step == stop_at - 1:
                stopping.request()
            return step()

        trainer.train_step = stopping_step
        with pytest.raises(stopping.Stopped):
            trainer.fit()
        stopping.clear()
        return trainer
    trainer.fit()
    return trainer


@pytest.mark.parametrize("strategy", ["torch", "fsdp2"])
def test_a_lora_run_resumes_exactly_and_saves_merged_weights_and_adapters(tmp_path, sft_base,
                                                                          strategy):
    straight = _run(sft_base, tmp_path / "straight", strategy=strategy)
    _run(sft_base, tmp_path / "resumed", stop_at=3, strategy=strategy)
    resumed = _run(sft_base, tmp_path / "resumed", strategy=strategy)
    a, b = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3, 4]
    for left, right in zip(a, b):
        assert stable_metrics(left) == pytest.approx(stable_metrics(right), abs=1e-6), left["step"]
    assert max(m["actor/kl_loss"] for m in a) > 0, "the policy must move away from its base"
    merged = straight.model.state_dict()
    for key, value in merged.items():
        assert torch.allclose(value, resumed.model.state_dict()[key], atol=1e-6), key
    assert [step for step, _ in list_checkpoints(tmp_path / "resumed")] == [2, 3, 4]

    last = tmp_path / "straight" / "checkpoints" / "step_4"
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in (last / "adapter").iterdir()}
    if strategy == "fsdp2":  # the sharded state is the adapters' (and their AdamW moments)
        from rl_core.engines.fsdp import sharded_shapes

        names = sharded_shapes(last / "dcp" / "actor")
        assert any(".lora_" in name for name in names)
        assert not [n for n in names if ".layers." in n and ".lora_" not in n]  # no base layer
    export_checkpoint(last, tmp_path / "exported", dtype="float32")
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported").state_dict()
    assert sorted(exported) == sorted(merged)
    for key, value in merged.items():  # the merged weights, no adapter entries
        assert torch.allclose(exported[key], value.float(), atol=1e-6), key


def test_sft_and_dpo_train_adapters(tmp_path, sft_base):
    from safetensors.torch import load_file

    from rl_core.recipes.dpo import DPOTrainer
    from rl_core.recipes.sft import SFTTrainer

    sft = SFTTrainer(resolve_spec(tiny_spec(tmp_path / "sft", model={"path": str(sft_base)},
                                            actor={"lora": LORA, "lr": 1e-3},
                                            trainer={"total_steps": 2})))
    sft.fit()
    saved = load_file(tmp_path / "sft" / "checkpoints" / "step_2" / "model.safetensors")
    merged = sft.engine.full_state_dict()
    assert set(saved) <= set(merged) and len(saved) >= len(merged) - 1  # a tied head is left out
    for name, value in saved.items():  # the merged model, not the base
        assert torch.equal(value, merged[name]), name
    dpo = DPOTrainer(resolve_spec(tiny_spec(tmp_path / "dpo", algorithm="dpo",
                                            model={"path": str(sft_base)},
                                            actor={"lora": LORA, "lr": 1e-3},
                                            trainer={"total_steps": 2})))
    assert dpo.ctl.roles.reference is None  # the actor's base is DPO's reference
    metrics = dpo.fit()
    assert 0 < metrics["dpo/loss"] < 1.0 and metrics["dpo/pairs"] > 0
