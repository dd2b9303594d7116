"""`actor.strategy: megatron` in the run spec: its layout fields, what it refuses (naming the
field and the fix), the model checks of its layout, the ranks' rows, the resume check."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rl_core.controller import check_strategy
from rl_core.engines.megatron import recompute_config
from rl_core.errors import InputError
from rl_core.spec import RunSpec, SpecError, model_violations, resolve_spec

GPUS = {"data": {"synthetic": {"task": "addition"}},
        "resources": {"device_type": "gpu", "devices_per_node": 8},
        "actor": {"strategy": "megatron"}}
SIZES = ["data.train_batch_size=16", "actor.ppo_mini_batch_size=8"]


def spec_of(*overrides: str, raw: dict[str, Any] = GPUS) -> RunSpec:
    return resolve_spec(raw, [*SIZES, *overrides])


def errors_of(*overrides: str, raw: dict[str, Any] = GPUS) -> list[dict[str, str]]:
    with pytest.raises(SpecError) as caught:
        spec_of(*overrides, raw=raw)
    return caught.value.errors


def test_a_megatron_layout_validates_and_round_trips():
    spec = spec_of("parallel.tensor_parallel_size=2", "parallel.pipeline_parallel_size=2",
                   "parallel.virtual_pipeline_parallel_size=2", "actor.recompute=selective")
    assert (spec.model_parallel_size, spec.data_parallel_size) == (4, 2)
    again = RunSpec.model_validate(spec.model_dump(mode="json"))
    assert again == spec and again.actor.recompute == "selective"
    assert again.parallel.virtual_pipeline_parallel_size == 2


@pytest.mark.parametrize(("overrides", "raw", "field", "fix"), [
    ((), {**GPUS, "resources": {"device_type": "cpu"}}, "actor.strategy",
     "megatron needs gpu or npu devices"),
    (("algorithm=dpo", "data.synthetic=null", "data.train_files=[x.jsonl]",
      "data.chosen_key=c", "data.rejected_key=r"), GPUS, "actor.strategy",
     "dpo trains with fsdp2 or torch"),
    (("parallel.context_parallel_size=2", "actor.use_remove_padding=true"), GPUS,
     "parallel.context_parallel_size", "use actor.strategy: fsdp2 for context parallelism"),
    (("parallel.resharding=none",), GPUS, "parallel.resharding", "set it to auto"),
    (("actor.router_aux_loss_coef=0.001",), GPUS, "actor.router_aux_loss_coef",
     "leave it unset or 0"),
    (("actor.master_weights=false",), GPUS, "actor.master_weights",
     "megatron always keeps float32 master weights"),
    (("parallel.virtual_pipeline_parallel_size=2",), GPUS,
     "parallel.virtual_pipeline_parallel_size", "set parallel.pipeline_parallel_size above 1"),
    (("parallel.pipeline_parallel_size=2",), {**GPUS, "actor": {"strategy": "fsdp2"}},
     "parallel.pipeline_parallel_size", "set actor.strategy: megatron"),
    (("actor.recompute=full",), {**GPUS, "actor": {"strategy": "fsdp2"}}, "actor.recompute",
     "set actor.strategy: megatron, or use model.gradient_checkpointing"),
    (("parallel.expert_parallel_size=3",), GPUS, "parallel.expert_parallel_size",
     "does not divide the 8 data- and context-parallel devices"),
], ids=lambda v: v if isinstance(v, str) and "." in v and " " not in v else None)
def test_what_megatron_cannot_do_is_refused_naming_the_field_and_the_fix(overrides, raw, field,
                                                                         fix):
    errors = errors_of(*overrides, raw=raw)
    matching = [e for e in errors if e["field"] == field]
    assert matching and any(fix in e["message"] for e in matching), errors


def test_megatron_takes_tensor_and_expert_parallelism_together():
    spec = spec_of("parallel.tensor_parallel_size=2", "parallel.expert_parallel_size=4")
    moe = SimpleNamespace(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
    assert model_violations(spec, 8, "qwen3_moe", layout=moe) == []
    fsdp2 = spec.model_copy(update={"actor": spec.actor.model_copy(update={"strategy": "fsdp2"})})
    assert [f for f, _ in model_violations(fsdp2, 8, "qwen3_moe")] == [
        "parallel.tensor_parallel_size"]


def test_the_layout_must_split_the_models_layers_and_heads():
    spec = spec_of("parallel.tensor_parallel_size=4", "parallel.pipeline_parallel_size=2")
    model = SimpleNamespace(num_hidden_layers=5, num_attention_heads=12, num_key_value_heads=2)
    errors = dict(model_violations(spec, 0, "qwen2", layout=model))
    assert errors["parallel.pipeline_parallel_size"].startswith(
        "the model (qwen2)'s 5 decoder layers do not divide into 2 pipeline stages")
    assert "4 does not divide the model (qwen2)'s 2 key/value heads" in \
        errors["parallel.tensor_parallel_size"]
    fits = SimpleNamespace(num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4)
    assert model_violations(spec, 0, "qwen2", layout=fits) == []
    tied = SimpleNamespace(**vars(fits), tie_word_embeddings=True)
    [(field, message)] = model_violations(spec, 0, "qwen2", layout=tied)
    assert field == "parallel.pipeline_parallel_size" and "ties its input and output" in message
    whole = spec_of("parallel.tensor_parallel_size=4")
    assert model_violations(whole, 0, "qwen2", layout=tied) == []
    interleaved = spec_of("parallel.pipeline_parallel_size=2",
                          "parallel.virtual_pipeline_parallel_size=3")
    assert [f for f, _ in model_violations(interleaved, 0, layout=fits)] == [
        "parallel.virtual_pipeline_parallel_size"]


def test_the_ranks_of_a_pipeline_hold_the_same_rows_in_megatrons_order():
    spec = spec_of("parallel.tensor_parallel_size=2", "parallel.pipeline_parallel_size=2")
    # tp fastest, then data, then pipeline: ranks 0-3 are stage 0, 4-7 stage 1
    assert [spec.data_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    fsdp2 = spec_of("parallel.tensor_parallel_size=2",
                    raw={**GPUS, "actor": {"strategy": "fsdp2"}})
    assert [fsdp2.data_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_a_checkpoint_of_another_engine_is_refused_at_resume():
    spec = spec_of()
    state = {"engine": {"step": 3, "sharded": True}}  # FSDP2's
    with pytest.raises(InputError) as caught:
        check_strategy(Path("/ckpt/step_3"), state, spec)
    assert str(caught.value).startswith("actor.strategy: /ckpt/step_3 was saved with "
                                        "actor.strategy=fsdp2, this run uses megatron")
    check_strategy(Path("/ckpt/step_3"),
                   {"engine": {"step": 3, "sharded": True, "strategy": "megatron"}}, spec)


def test_recompute_follows_gradient_checkpointing_unless_set():
    assert recompute_config(None) == {}
    assert recompute_config(None, checkpointing=True)["recompute_granularity"] == "full"
    assert recompute_config("selective", checkpointing=True) == {
        "recompute_granularity": "selective"}
    assert recompute_config("full")["recompute_method"] == "uniform"


def test_a_run_without_the_extra_stops_before_any_role_starts(monkeypatch):
    import rl_core.engines.mcore as mcore
    from rl_core.controller import preflight

    monkeypatch.setattr(mcore, "megatron_missing", lambda: "megatron-core")
    with pytest.raises(InputError, match="^actor.strategy: megatron needs megatron-core, "
                                         "which is not installed here: pip install"):
        preflight(spec_of(), local=False)
    monkeypatch.undo()
    preflight(spec_of(), local=False)  # installed for the tests: nothing refused


def test_packed_sequences_without_transformer_engine_are_refused_naming_the_field(tmp_path):
    from rl_core.engines.mcore import MegatronLayout
    from rl_core.engines.megatron import MegatronEngine

    with pytest.raises(InputError, match="^actor.use_remove_padding: with actor.strategy: "
                                         "megatron packed sequences need Transformer Engine"):
        MegatronEngine(str(tmp_path), layout=MegatronLayout(), lr=1e-6, remove_padding=True)
