"""The memory plan of `actor.strategy: megatron`: a pipeline stage's part of the model split over
tensor- and expert-parallel devices, the float32 gradient buffer, the distributed optimizer's
shard, activations under recomputation and the 1F1B schedules (rl_core.memory_plan's module
docstring), by hand on a small shape; the two Megatron examples against their devices; the
other engines' plans as before."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rl_core import memory_plan as mp
from rl_core.spec import load_spec, model_violations, resolve_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_32B = ROOT / "examples" / "grpo_qwen3_32b_megatron.yaml"
EXAMPLE_30B_A3B = ROOT / "examples" / "grpo_qwen3_30b_a3b_megatron.yaml"

# h=8, I=16, 2 layers, 2 heads of 4 (1 kv head), V=10, tied embeddings, no biases: a layer
# 592 parameters (q 64, k 32, v 32, o 64, gate/up/down 384, two norms 16), the embedding 80,
# the final norm 8: 1272 (tests/unit/test_memory_plan.py counts it).
SMALL = mp.ModelShape(hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, vocab_size=10,
                      tie_word_embeddings=True)
# The same with 4 experts of width 4 in each layer (2 a token): experts 4·3·8·4 = 384 and a
# router 4·8 = 32 in place of the dense MLP: a layer 192 + 416 + 16 = 624, 240 of it dense.
SMALL_MOE = dataclasses.replace(SMALL, model_type="qwen3_moe", num_experts=4,
                                num_experts_per_tok=2, moe_intermediate_size=4)


def megatron_spec(devices: int = 8, **parallel):
    """A valid GRPO spec on synthetic data, trained by megatron in bfloat16 on `devices` NPUs."""
    return resolve_spec({
        "data": {"synthetic": {"task": "addition"}, "train_batch_size": 8},
        "model": {"dtype": "bfloat16"},
        "rollout": {"engine": "native"},
        "actor": {"strategy": "megatron", "use_remove_padding": True},
        "parallel": parallel,
        "resources": {"device_type": "npu", "devices_per_node": devices}})


def by_name(plan: mp.MemoryPlan) -> dict[str, mp.Component]:
    return {c.name: c for c in plan.components}


# --------------------------------------------------------------------------- parameters


def test_the_last_stage_keeps_a_copy_of_tied_embeddings_and_is_the_one_planned():
    # two stages of one layer: the first 592 + the embedding 80 = 672; the last 592 + the
    # final norm 8 + the output layer, a copy of the tied embedding, 80 = 680
    assert mp.megatron_stage_parameters(SMALL, 2) == (680, 0, "last")
    # one stage holds everything once: the tied embedding is its own output layer
    assert mp.megatron_stage_parameters(SMALL, 1) == (1272, 0, "only")
    untied = dataclasses.replace(SMALL, tie_word_embeddings=False)
    assert mp.megatron_stage_parameters(untied, 1) == (1352, 0, "only")
    assert mp.megatron_stage_parameters(untied, 2) == (680, 0, "last")


def test_a_critics_first_stage_is_planned_its_last_holding_only_the_score_layer():
    # the last stage: 592 + the final norm 8 + a score layer 8 -> 1 with its bias: 609
    assert mp.megatron_stage_parameters(SMALL, 2, critic=True) == (672, 0, "first")
    assert mp.megatron_stage_parameters(SMALL, 1, critic=True)[0] == SMALL.critic_parameters


def test_a_device_holds_its_stages_weights_over_tensor_parallelism_at_tp2_pp2():
    spec = megatron_spec(tensor_parallel_size=2, pipeline_parallel_size=2)
    assert spec.data_parallel_size == 2  # 8 NPUs / (2 x 2)
    result = mp.plan(spec, SMALL)
    parts = by_name(result)
    # the last stage's 680 parameters over 2 devices: 340 each
    assert parts["actor parameters"].bytes == 340 * 2  # bfloat16
    assert parts["actor parameters"].phases == mp.PHASES
    assert parts["actor gradient buffer"].bytes == 340 * 4  # float32, as many
    assert parts["actor gradient buffer"].phases == mp.PHASES  # allocated with the model
    # the distributed optimizer: 12 bytes a parameter over the 2 data-parallel ranks
    assert parts["actor main parameter shard"].bytes == 170 * 4
    assert parts["actor Adam moments"].bytes == 170 * 8
    assert parts["actor Adam moments"].phases == mp.TRAINED
    # the frozen reference: its stage's weights only
    assert parts["reference parameters"].bytes == 340 * 2
    assert not [name for name in parts if name.startswith("reference") and "gradient" in name]
    # the bridge's and the weight sync's largest tensor, in bfloat16: of the embedding 80, the
    # fused q/k/v 8 x (8 + 2 x 4) = 128 and the fused gate/up 2 x 8 x 16 = 256, the last
    assert mp.largest_tensor(SMALL) == 256
    assert parts["actor load tensor"].bytes == 256 * 2
    assert parts["actor load tensor"].phases == ("load",)
    assert parts["actor weight sync tensor"].phases == ("rollout",)
    assert result.setup.ranks == 8
    assert "actor.strategy=megatron over 8 NPU(s), 2 to a layer, 2 pipeline stages" in (
        mp.format_table(result))


def test_the_distributed_optimizer_shards_over_the_data_parallel_ranks():
    shards = {}
    for devices in (8, 16):
        spec = megatron_spec(devices, tensor_parallel_size=2, pipeline_parallel_size=2)
        parts = by_name(mp.plan(spec, SMALL))
        assert parts["actor parameters"].bytes == 340 * 2  # the same stage on every layout
        shards[devices] = parts["actor main parameter shard"].bytes // 4
    # 340 parameters of a device over D = 2 and 4 ranks
    assert shards == {8: 170, 16: 85}


def test_offloading_the_optimizer_keeps_its_shard_in_host_memory_outside_the_step():
    spec = megatron_spec(tensor_parallel_size=2, pipeline_parallel_size=2)
    setup = dataclasses.replace(mp.setup_of(spec), offload_optimizer=True)
    parts = by_name(mp.plan_setup(setup, SMALL, None))
    for name in ("actor main parameter shard", "actor Adam moments"):
        assert parts[name].phases == ("step",) and parts[name].host
    assert parts["actor gradient buffer"].phases == mp.PHASES and not parts[
        "actor gradient buffer"].host


def test_float32_weights_are_their_own_main_parameters():
    spec = megatron_spec(tensor_parallel_size=2, pipeline_parallel_size=2)
    setup = dataclasses.replace(mp.setup_of(spec), dtype="float32")
    parts = by_name(mp.plan_setup(setup, SMALL, None))
    assert "actor main parameter shard" not in parts
    assert parts["actor parameters"].bytes == 340 * 4
    assert parts["actor Adam moments"].bytes == 170 * 8


def test_experts_are_split_over_tensor_times_expert_parallel_devices():
    spec = megatron_spec(tensor_parallel_size=2, expert_parallel_size=2)
    assert spec.data_parallel_size == 4
    dense, experts, stage = mp.megatron_stage_parameters(SMALL_MOE, 1)
    # two layers of 240 dense, the embedding 80 and the final norm 8; 2 x 384 experts
    assert (dense, experts, stage) == (568, 768, "only")
    parts = by_name(mp.plan(spec, SMALL_MOE))
    # dense 568 / 2 = 284, experts 768 / (2 x 2) = 192
    assert parts["actor parameters"].bytes == (284 + 192) * 2
    # dense state over D·c = 4 ranks (71), experts' over D·c / e = 2 (96)
    assert parts["actor main parameter shard"].bytes == (71 + 96) * 4
    assert parts["reference parameters"].bytes == (284 + 192) * 2


# --------------------------------------------------------------------------- activations


def test_recomputation_lowers_the_activations_by_hand():
    # bfloat16 per layer: norms 96, attention 5·2·8 = 80, MLP 128: 304; beyond the layers
    # the final norm and head input 64 and the gradients in flight 96
    none = mp.megatron_activation_bytes_per_token(SMALL, 2, None)
    assert none == 2 * 304 + 160 == mp.activation_bytes_per_token(SMALL, 2, False)
    # full: each layer's input (2·8) and one layer recomputed
    full = mp.megatron_activation_bytes_per_token(SMALL, 2, "full")
    assert full == 2 * 16 + 304 + 160 == mp.activation_bytes_per_token(SMALL, 2, True)
    # selective: the attention core's output (2·8) is not kept
    selective = mp.megatron_activation_bytes_per_token(SMALL, 2, "selective")
    assert selective == 2 * (304 - 16) + 160
    assert full < selective < none
    # eager attention's s² term goes with the core too: a·s·(4 + b) = 2·100·6 a layer
    eager = mp.megatron_activation_bytes_per_token(SMALL, 2, "selective", seq_len=100,
                                                   attention="eager")
    assert eager == selective


def test_a_pipeline_keeps_l_layers_worth_and_interleaving_multiplies_it():
    deep = dataclasses.replace(SMALL, num_hidden_layers=8)
    plain = mp.megatron_activation_bytes_per_token(deep, 2, None, pipeline=2)
    assert plain == 8 * 304 + 160  # 2 micro-batches in flight x 4 layers
    # v = 2 chunks a device: (1 + (2 - 1)/(2·2)) = 5/4 of it
    assert mp.megatron_activation_bytes_per_token(deep, 2, None, 1, 2, 2) == 8 * 304 * 5 // 4 + 160
    # p = 4, v = 2: 1 + 3/8
    assert mp.megatron_activation_bytes_per_token(deep, 2, None, 1, 4, 2) == 8 * 304 * 11 // 8 + 160


def test_tensor_parallel_activations_split_as_fsdp2s_with_the_gathered_inputs_whole():
    # a layer 304 / 2 + 2·2·8 gathered = 184; beyond the layers 160 / 2 + the head's input 16
    assert mp.megatron_activation_bytes_per_token(SMALL, 2, None, 2) == 2 * 184 + 96
    assert mp.megatron_activation_bytes_per_token(SMALL, 2, "full", 2) == 2 * 8 + 184 + 96


def test_the_plan_counts_the_resolved_recompute_and_suggests_full_recompute():
    spec = megatron_spec(tensor_parallel_size=2, pipeline_parallel_size=2)
    assert spec.actor.recompute is None and not spec.model.gradient_checkpointing
    setup = mp.setup_of(spec)
    assert setup.recompute is None
    checkpointed = resolve_spec({**spec.model_dump(mode="json"),
                                 "model": {"dtype": "bfloat16", "gradient_checkpointing": True}})
    assert mp.setup_of(checkpointed).recompute == "full"
    kept = by_name(mp.plan_setup(setup, SMALL, None))["actor activations"].bytes
    full = by_name(mp.plan_setup(dataclasses.replace(setup, recompute="full"), SMALL,
                                 None))["actor activations"].bytes
    assert full < kept
    changes = [change for change, _ in mp._changes(setup)]
    assert "actor.recompute=full" in changes
    assert not any("actor.offload.param" in change for change in changes)  # fsdp2's only


# --------------------------------------------------------------------------- examples


def test_the_32b_example_fits_a_910b_and_would_not_without_tensor_and_pipeline_parallelism():
    spec = load_spec(EXAMPLE_32B)
    shape = mp.shape_of(spec)
    assert (spec.actor.strategy, spec.data_parallel_size) == ("megatron", 2)
    assert model_violations(spec, shape.num_experts, shape.model_type, layout=shape) == []
    result = mp.plan(spec, shape)
    assert result.device_memory_bytes == 64 * mp.GIB and result.fits, mp.format_table(result)
    whole = load_spec(EXAMPLE_32B, ["parallel.tensor_parallel_size=1",
                                    "parallel.pipeline_parallel_size=1",
                                    "rollout.tensor_parallel_size=1"])
    assert whole.actor.strategy == "megatron"
    assert mp.plan(whole, shape).fits is False


def test_the_30b_a3b_example_fits_its_h200s_and_its_training_state_fits_64_gb():
    spec = load_spec(EXAMPLE_30B_A3B)
    shape = mp.shape_of(spec)
    assert shape.is_moe and spec.parallel.expert_parallel_size == 8
    assert model_violations(spec, shape.num_experts, shape.model_type, layout=shape) == []
    assert mp.plan(spec, shape, 141 * mp.GIB).fits
    # on 64 GB the Megatron state fits; the whole-model rollout a mixture of experts generates
    # with (57 GiB of weights) does not
    small = mp.plan(spec, shape, 64 * mp.GIB)
    assert small.fits is False and small.peak_phase == "rollout"
    totals = small.phase_bytes()
    assert max(totals["backward"], totals["step"]) <= small.usable_bytes


# --------------------------------------------------------------------------- other engines


def test_fsdp2_plans_are_as_before():
    """The figures of the fsdp2 examples at 80 GB, as planned before megatron was known."""
    expected = {
        "grpo_qwen3_32b.yaml": ({"load": 12469062656, "rollout": 44998178816,
                                 "log-probs": 5143422464, "backward": 6404602496,
                                 "step": 2333744640}, 309867607680),
        "grpo_qwen3_30b_a3b.yaml": ({"load": 63553572864, "rollout": 71295397888,
                                     "log-probs": 7870130176, "backward": 10311485952,
                                     "step": 3733991424}, 339669864192),
    }
    for name, (phases, host) in expected.items():
        spec = load_spec(ROOT / "examples" / name)
        result = mp.plan(spec, mp.shape_of(spec), 80 * mp.GIB)
        assert (result.phase_bytes(), result.host_bytes) == (phases, host), name
        setup = result.setup
        assert (setup.pipeline_parallel, setup.virtual_pipeline, setup.recompute) == (1, 1, None)
        assert "pipeline" not in mp.format_table(result)


@pytest.mark.parametrize("strategy", ["torch", "fsdp2"])
def test_other_engines_have_no_megatron_components(strategy):
    spec = resolve_spec({"data": {"synthetic": {"task": "addition"}},
                         "actor": {"strategy": strategy}})
    names = by_name(mp.plan(spec, SMALL))
    assert not [n for n in names if "gradient buffer" in n or "load tensor" in n
                or "sync tensor" in n]
