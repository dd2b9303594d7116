"""The memory plan: exact parameter counts, hand-computed bytes per component, the verdict on
the 7B example and the `plan` command."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rl_core import memory_plan as mp
from rl_core.__main__ import main
from rl_core.errors import InputError
from rl_core.spec import load_spec, resolve_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_7B = ROOT / "examples" / "grpo_qwen25_7b.yaml"

# A shape small enough to count by hand: h=8, I=16, 2 layers, 2 heads of 4 (1 kv head), V=10,
# tied embeddings, no biases. Per layer: q 8·8=64, k 8·4=32, v 32, o 8·8=64, gate/up/down
# 3·8·16=384, two norms 2·8=16: 592. Two layers 1184, embeddings 10·8=80, final norm 8: 1272.
SMALL = mp.ModelShape(hidden_size=8, intermediate_size=16, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, vocab_size=10,
                      tie_word_embeddings=True)

# Published sizes (model cards) of the models in KNOWN_SHAPES.
PUBLISHED = {
    "Qwen/Qwen2.5-0.5B-Instruct": 0.49e9,
    "Qwen/Qwen2.5-1.5B-Instruct": 1.54e9,
    "Qwen/Qwen2.5-7B-Instruct": 7.61e9,
    "Qwen/Qwen2.5-14B-Instruct": 14.7e9,
    "Qwen/Qwen2.5-32B-Instruct": 32.5e9,
    "Qwen/Qwen3-8B": 8.2e9,
    "Qwen/Qwen3-32B": 32.8e9,
    "meta-llama/Llama-3.1-8B-Instruct": 8.03e9,
}


def small_spec(**sections):
    """A valid GRPO spec on synthetic data, sections merged over the defaults."""
    raw = {"data": {"synthetic": {"task": "addition"}}, **sections}
    return resolve_spec(raw)


def by_name(plan: mp.MemoryPlan) -> dict[str, mp.Component]:
    return {c.name: c for c in plan.components}


# --------------------------------------------------------------------------- parameters


@pytest.mark.parametrize("size", ["nano", "small", "base"])
def test_tiny_parameter_counts_are_exact(size):
    from rl_core.models.tiny import build_tiny, count_parameters

    model, _ = build_tiny(size)
    assert mp.tiny_shape(size).parameters == count_parameters(model)
    assert mp.shape_from_config(model.config.to_dict()).parameters == count_parameters(model)


def test_tiny_vocabulary_is_the_tokenizers():
    from rl_core.models.tokenizer import VOCAB

    assert mp.TINY_VOCAB_SIZE == len(VOCAB)


def test_llama_and_qwen3_counts_are_exact_with_biases_head_dim_and_qk_norm():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
              "tie_word_embeddings": False}
    llama = LlamaConfig(**common, attention_bias=True, mlp_bias=True)
    qwen3 = Qwen3Config(**common, head_dim=24)  # heads × head_dim = 96 ≠ hidden_size
    for config, cls in ((llama, LlamaForCausalLM), (qwen3, Qwen3ForCausalLM)):
        with torch.device("meta"):
            model = cls(config)
        assert mp.shape_from_config(config.to_dict()).parameters == sum(
            p.numel() for p in model.parameters())


@pytest.mark.parametrize("tied", [True, False])
def test_critic_count_is_the_token_classifier_with_one_label(tied):
    import torch
    from transformers import AutoModelForTokenClassification, Qwen2Config

    config = Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                         tie_word_embeddings=tied, num_labels=1)
    with torch.device("meta"):
        model = AutoModelForTokenClassification.from_config(config)
    assert mp.shape_from_config(config.to_dict()).critic_parameters == sum(
        p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_known_models_are_within_one_percent_of_their_published_size(name):
    assert mp.KNOWN_SHAPES[name].parameters == pytest.approx(PUBLISHED[name], rel=0.01)


def test_the_small_shape_counts_as_by_hand():
    assert SMALL.layer_parameters == 592
    assert SMALL.parameters == 1272
    # no output head; a score layer 8 -> 1 with its bias: 1272 + 8 + 1
    assert SMALL.critic_parameters == 1281


def test_known_names_match_the_hub_name_or_the_folder_name_in_any_case():
    shape = mp.KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"]
    for name in ("/models/Qwen2.5-7B-Instruct", "qwen/qwen2.5-7b-instruct", "QWEN2.5-7B/"):
        assert mp.known_shape(name) == shape
    assert mp.known_shape("/models/my-finetune") is None


# --------------------------------------------------------------------------- shape_of


def test_shape_of_reads_config_json_then_tiny_presets_then_known_names(tmp_path):
    config = {"model_type": "qwen2", "hidden_size": 8, "intermediate_size": 16,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "vocab_size": 10, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    folder = mp.shape_of(small_spec(model={"path": str(tmp_path)}))
    assert folder.parameters == 1272 + 2 * (8 + 4 + 4)  # qwen2: q/k/v biases in both layers
    assert mp.shape_of(small_spec()) == mp.tiny_shape("small")
    known = mp.shape_of(small_spec(model={"path": "/nowhere/Qwen3-8B"}))
    assert known == mp.KNOWN_SHAPES["Qwen/Qwen3-8B"]


def test_an_unknown_unreadable_model_is_an_input_error_naming_model_path():
    with pytest.raises(InputError, match=r"^model\.path: cannot read .*known model"):
        mp.shape_of(small_spec(model={"path": "/nowhere/my-finetune"}))


def test_a_mixture_of_experts_with_shared_experts_is_refused():
    with pytest.raises(InputError, match="shared experts or dense layers"):
        mp.shape_from_config({"hidden_size": 8, "num_experts": 128, "moe_intermediate_size": 4,
                              "shared_expert_intermediate_size": 8}, "model.path: x")
    with pytest.raises(InputError, match="model.path: x: a mixture of experts"):
        mp.shape_from_config({"hidden_size": 8, "n_routed_experts": 256,
                              "first_k_dense_replace": 3}, "model.path: x")


def test_a_qwen3_moe_config_counts_its_experts_and_its_active_parameters(tmp_path):
    """The shape read from a tiny Qwen3-MoE folder's config.json counts what transformers
    builds; the known Qwen3 MoE models count their published sizes."""
    from rl_core.models.tiny import build_tiny, count_active_parameters, count_parameters

    model, _ = build_tiny("moe")
    shape = mp.shape_from_config(model.config.to_dict())
    assert (shape.parameters, shape.active_parameters) == (count_parameters(model),
                                                          count_active_parameters(model))
    assert mp.tiny_shape("moe").parameters == shape.parameters
    big = mp.KNOWN_SHAPES["Qwen/Qwen3-30B-A3B"]
    assert round(big.parameters / 1e9, 1) == 30.5 and round(big.active_parameters / 1e9, 1) == 3.4
    huge = mp.KNOWN_SHAPES["Qwen/Qwen3-235B-A22B"]
    assert round(huge.parameters / 1e9) == 235 and round(huge.active_parameters / 1e9) == 22


def test_a_vision_language_model_counts_its_vision_tower():
    """tiny:vl (and its warm start): the text model, its 3 vision tokens and the vision tower,
    exactly as built, from the preset and from its config.json; the known Qwen2.5-VL models
    count their published sizes."""
    from rl_core.models.tiny import count_parameters
    from rl_core.models.vision import build_tiny_vl

    model, _ = build_tiny_vl("vl")
    shape = mp.shape_from_config(model.config.to_dict())
    assert shape.parameters == count_parameters(model) == mp.tiny_shape("vl").parameters
    assert mp.tiny_shape("vl-squares") == mp.tiny_shape("vl")
    assert shape.vision_parameters == count_parameters(model.model.visual)
    published = {"3B": 3.75, "7B": 8.29, "32B": 33.45, "72B": 73.41}
    for size, billions in published.items():
        counted = mp.KNOWN_SHAPES[f"Qwen/Qwen2.5-VL-{size}-Instruct"].parameters
        assert round(counted / 1e9, 2) == billions, size


def test_expert_parallelism_gathers_a_share_of_each_layers_experts():
    sections = {"model": {"path": "tiny:moe"}, "actor": {"strategy": "fsdp2"},
                "resources": {"devices_per_node": 4},
                "data": {"synthetic": {"task": "addition"}, "train_batch_size": 8}}
    whole = mp.plan(small_spec(**sections))
    parted = mp.plan(small_spec(**sections, parallel={"expert_parallel_size": 4}))
    gathered = {p.setup.expert_parallel: next(c.bytes for c in p.components
                                              if c.name == "actor gathered layers (log-probs)")
                for p in (whole, parted)}
    shape = mp.tiny_shape("moe")
    assert gathered[1] - gathered[4] == 2 * shape.expert_parameters * 3 // 4 * 4  # float32
    table = mp.format_table(parted)
    assert "3.38M parameters (1.02M active)" in table and "experts split 4 ways" in table
    assert parted.to_dict()["active_parameters"] == shape.active_parameters


# --------------------------------------------------------------------------- components


def test_pure_bfloat16_keeps_everything_in_the_model_dtype_on_every_rank():
    spec = small_spec(model={"dtype": "bfloat16"}, resources={"devices_per_node": 2},
                      data={"synthetic": {"task": "addition"}, "train_batch_size": 4},
                      actor={"master_weights": False})
    parts = by_name(mp.plan(spec, SMALL))
    assert parts["actor parameters"].bytes == 1272 * 2
    assert "actor master weights" not in parts
    assert parts["actor gradients"].bytes == 1272 * 2
    assert parts["actor AdamW moments"].bytes == 2 * 1272 * 2  # two moments in bfloat16
    assert parts["actor gradient all-reduce"].bytes == 1272 * 2  # 2 ranks: one flat copy
    assert parts["actor gradients"].phases == ("backward", "step")


def test_bfloat16_with_master_weights_steps_float32_copies():
    spec = small_spec(model={"dtype": "bfloat16"}, resources={"devices_per_node": 2},
                      data={"synthetic": {"task": "addition"}, "train_batch_size": 4})
    parts = by_name(mp.plan(spec, SMALL))
    assert parts["actor parameters"].bytes == 1272 * 2  # what the model computes with
    assert parts["actor master weights"].bytes == 1272 * 4
    assert parts["actor master weights"].phases == mp.PHASES  # made when the engine is
    assert parts["actor gradients"].bytes == 1272 * 4  # accumulated in float32
    assert parts["actor AdamW moments"].bytes == 2 * 1272 * 4
    assert parts["actor gradient all-reduce"].bytes == 1272 * 4
    float32 = by_name(mp.plan(small_spec(), SMALL))  # float32: the weights are the masters
    assert "actor master weights" not in float32
    assert float32["actor AdamW moments"].bytes == 2 * 1272 * 4


def test_fsdp2_shards_float32_master_state_over_the_data_parallel_ranks():
    spec = small_spec(model={"dtype": "bfloat16"})
    setups = {d: dataclasses.replace(mp.setup_of(spec), strategy="fsdp2", devices=d)
              for d in (1, 4)}
    parts = {d: by_name(mp.plan_setup(s, SMALL, None)) for d, s in setups.items()}
    # 1272 parameters in float32 over 4 ranks: ceil(1272 / 4) = 318 each, 4 bytes
    assert parts[4]["actor parameter shards"].bytes == 318 * 4
    assert parts[4]["actor gradient shards"].bytes == 318 * 4
    assert parts[4]["actor AdamW moments"].bytes == 2 * 318 * 4
    for name in ("actor parameter shards", "actor gradient shards", "actor AdamW moments"):
        assert parts[1][name].bytes == 4 * parts[4][name].bytes
    # loaded on the host in bfloat16, then cast to float32 there before sharding: 1272 · (2 + 4)
    host_copy = parts[4]["actor host copy before sharding"]
    assert host_copy.bytes == 1272 * 6 and host_copy.host and host_copy.phases == ()
    # on the device at load: the rollout's bfloat16 model, the shards and the float32 unit
    # being sharded, the larger of a layer (592) and the root (88)
    assert parts[4]["actor unit being sharded"].bytes == 592 * 4
    assert parts[4]["rollout full weights"].bytes == 1272 * 2
    load = mp.plan_setup(setups[4], SMALL, None).phase_bytes("actor")["load"]
    assert load == 1272 * 2 + 318 * 4 + 592 * 4  # the moments come with the first step
    # root (80 + 8) + two gathered layers (2 · 592), in bfloat16
    assert parts[4]["actor gathered layers"].bytes == (88 + 2 * 592) * 2


def test_offload_moves_fsdp2_shards_and_the_reference_to_host_memory():
    spec = small_spec(model={"dtype": "bfloat16"}, reference={"offload": True})
    setup = dataclasses.replace(mp.setup_of(spec), strategy="fsdp2", devices=4,
                                offload_param=True, offload_optimizer=True, device_type="npu")
    result = mp.plan_setup(setup, SMALL, None)
    parts = by_name(result)
    assert parts["actor parameter shards"].phases == () and parts["actor parameter shards"].host
    assert parts["reference parameter shards"].phases == ()  # sharded too, kept on the host
    assert parts["reference gathered layers"].phases == ("log-probs",)
    # params, grads, 2 moments; the reference's host copy and its shards; the actor's host copy
    # sharded at load (bfloat16 + float32); the rollout's own copy, parked while training runs
    assert result.host_bytes == 318 * 4 * 4 + 1272 * 2 + 318 * 2 + 1272 * 6 + 1272 * 2
    assert parts["rollout full weights"].phases == ("load", "rollout")
    plain = by_name(mp.plan_setup(dataclasses.replace(setup, strategy="torch", offload_param=False),
                                  SMALL, None))
    assert plain["reference parameters"].phases == ("log-probs",)  # whole, on the device to run
    on_cpu = by_name(mp.plan_setup(dataclasses.replace(setup, device_type="cpu"), SMALL, None))
    assert on_cpu["reference parameter shards"].phases == mp.PHASES  # the device is the host


def test_activations_per_token_by_hand_and_checkpointing_lowers_them():
    # bfloat16, per layer: norms 2·(4+2)·8 = 96, attention 5·2·8 = 80, MLP 4·2·16 = 128: 304.
    # Beyond the layers: final norm and head input (4+4)·8 = 64, gradients 2·(16+32) = 96.
    full = mp.activation_bytes_per_token(SMALL, 2, checkpointing=False)
    assert full == 2 * 304 + 64 + 96
    # checkpointed: each layer's input 2·8 per layer, one layer recomputed in full
    saved = mp.activation_bytes_per_token(SMALL, 2, checkpointing=True)
    assert saved == 2 * 16 + 304 + 64 + 96
    big = mp.KNOWN_SHAPES["Qwen/Qwen2.5-7B-Instruct"]
    assert mp.activation_bytes_per_token(big, 2, True) < mp.activation_bytes_per_token(
        big, 2, False) / 5


def test_kv_cache_and_logits_bytes_by_hand():
    spec = small_spec(model={"dtype": "bfloat16"}, resources={"device_type": "gpu"},
                      data={"synthetic": {"task": "addition"}, "train_batch_size": 4,
                            "val_batch_size": 2, "max_prompt_length": 100},
                      rollout={"engine": "native", "n_samples_per_prompt": 4,
                               "max_new_tokens": 20})
    parts = by_name(mp.plan(spec, SMALL))
    # rows 4 prompts × 4 = 16; length 120 rounded up to 128; per token keys and values of
    # 2 layers × 1 kv head × head_dim 4 × 2 bytes = 32
    assert parts["rollout KV cache"].bytes == 16 * 128 * 32
    assert parts["rollout KV compaction copy"].bytes == 12 * 128 * 32  # 3/4 of the rows
    # training micro-batch of 2 rows (actor default) × 20 response tokens × vocabulary 10:
    # bfloat16 logits and their gradient (2 + 2), one chunk of two float32 buffers (8)
    assert parts["actor logits"].bytes == 2 * 20 * 10 * (2 + 2 + 8)
    assert mp.logits_bytes(2, 20, 10, 2, training=False) == 2 * 20 * 10 * (2 + 8)
    # a large vocabulary: the chunk stays within its budget
    huge = 8 * 1024 * 151_936
    assert mp.logits_bytes(8, 1024, 151_936, 2, training=True) == huge * 4 + 256 * 2**20


def test_the_plans_chunk_budget_is_the_log_probs():
    from rl_core.algos.entropy import LOGPROB_CHUNK_BYTES

    assert mp.LOGPROB_CHUNK_BYTES == LOGPROB_CHUNK_BYTES


def test_the_fast_decoder_copies_every_projection_on_cpu_and_the_fused_ones_elsewhere():
    gpu, cpu = (by_name(mp.plan(small_spec(model={"dtype": "bfloat16"},
                                           resources={"device_type": kind},
                                           rollout={"engine": "native"}), SMALL))
                for kind in ("gpu", "cpu"))
    # per layer q/k/v and gate/up outputs 8 + 2·4 + 2·16 = 48, weights and biases (8 + 1)·48;
    # two layers in bfloat16
    assert gpu["rollout packed weights"].bytes == 2 * 9 * 48 * 2
    # on CPU oneDNN's prepacked o (8·8) and down (16·8) projections too
    assert cpu["rollout packed weights"].bytes == 2 * 9 * 48 * 2 + 2 * (64 + 128) * 2


def test_validation_batches_count_only_when_the_run_validates():
    data = {"synthetic": {"task": "addition"}, "train_batch_size": 2, "val_batch_size": 32}
    rows = {eval_every: mp.setup_of(small_spec(data=data, trainer={"eval_every": eval_every}))
            for eval_every in (0, 5)}
    assert (rows[0].rollout_prompts, rows[0].rollout_rows) == (2, 8)  # 2 prompts × 4 samples
    assert (rows[5].rollout_prompts, rows[5].rollout_rows) == (32, 32)  # greedy, one each


def test_phases_add_up_and_the_peak_is_the_largest():
    result = mp.plan(small_spec(), mp.tiny_shape("small"), 8 * mp.GIB)
    totals = result.phase_bytes()
    assert result.total_bytes == max(totals.values()) == totals[result.peak_phase]
    assert totals["backward"] == sum(c.bytes for c in result.components
                                     if "backward" in c.phases)
    assert result.fits and result.message.startswith("fits: ")
    assert result.roles == ("actor", "reference")
    by_role = [result.phase_bytes(role) for role in result.roles]
    assert {p: sum(r[p] for r in by_role) for p in mp.PHASES} == totals
    json.dumps(result.to_dict())


# --------------------------------------------------------------------------- verdict


def test_the_7b_example_on_the_torch_strategy_does_not_fit_a_910b_and_fsdp2_does():
    spec = load_spec(EXAMPLE_7B, ["actor.strategy=torch"])  # the example itself uses fsdp2
    result = mp.plan(spec, mp.shape_of(spec))  # /models/... is not here: the known shape
    assert spec.actor.strategy == "torch"
    assert result.device_memory_bytes == 64 * mp.GIB  # an NPU counts as a 910B
    assert result.fits is False
    assert "does not fit" in result.message and "actor.strategy=fsdp2" in result.message
    assert result.alternatives[0].change == "actor.strategy=fsdp2"
    assert result.alternatives[0].fits
    assert mp.plan(load_spec(EXAMPLE_7B), mp.shape_of(spec)).fits  # as the example is written


def test_without_device_memory_there_is_no_verdict():
    result = mp.plan(small_spec(), mp.tiny_shape("nano"))  # resources.device_type: cpu
    assert result.fits is None and "device memory unknown" in result.message


def test_device_memory_by_model_name_or_kind():
    assert mp.device_memory_of("ascend-910b") == 64 * mp.GIB
    assert mp.device_memory_of("910C") == 64 * mp.GIB  # per die
    assert mp.device_memory_of("npu") == 64 * mp.GIB
    assert mp.device_memory_of("H200") == 141 * mp.GIB
    assert mp.device_memory_of("nvidia-a100-40gb") == 40 * mp.GIB
    assert mp.device_memory_of("cpu") is None and mp.device_memory_of("gpu") is None


# --------------------------------------------------------------------------- command


def test_the_plan_command_prints_a_table(capsys):
    assert main(["plan", str(EXAMPLE_7B), "actor.strategy=torch"]) == 0
    out = capsys.readouterr().out
    assert "actor parameters" in out and "vLLM KV cache" in out
    assert "does not fit" in out
    assert main(["plan", str(EXAMPLE_7B)]) == 0  # the example as written: sharded, it fits
    out = capsys.readouterr().out
    assert "actor parameter shards" in out and "fits: " in out


def test_the_plan_command_prints_json_with_a_device_size(capsys):
    assert main(["plan", str(EXAMPLE_7B), "--device-memory-gb", "141", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] is True and data["device_memory_bytes"] == 141 * mp.GIB


def test_the_plan_command_exits_2_naming_model_path(capsys):
    assert main(["plan", str(EXAMPLE_7B), "model.path=/nowhere/my-finetune"]) == 2
    assert "model.path" in capsys.readouterr().err


def test_the_module_imports_without_torch():
    code = "import sys, rl_core.memory_plan; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "False"


def test_vllm_takes_its_share_while_generating_and_sleeps_in_the_other_phases():
    spec = small_spec(model={"dtype": "bfloat16"}, rollout={"engine": "vllm"})
    setup = dataclasses.replace(mp.setup_of(spec), device_type="npu", strategy="fsdp2",
                                gpu_memory_utilization=0.5, device_memory_bytes=100_000)
    parts = by_name(mp.plan_setup(setup, SMALL, 100_000))
    assert parts["vLLM weights"].bytes == 1272 * 2 and parts["vLLM weights"].host
    assert parts["vLLM weights"].phases == ("rollout",)
    # the rest of half the device is the KV cache, dropped while vLLM sleeps
    assert parts["vLLM KV cache"].bytes == 50_000 - 1272 * 2
    assert parts["vLLM KV cache"].phases == ("rollout",) and not parts["vLLM KV cache"].host
    template = parts["actor full model (template)"]
    assert template.phases == () and template.host
    assert not [name for name in parts if name.startswith("rollout ")]  # no native decoder
    # on the CPU it never sleeps and its cache holds VLLM_CPU_MAX_SEQS full sequences
    cpu = by_name(mp.plan_setup(dataclasses.replace(setup, device_type="cpu", strategy="torch"),
                                SMALL, None))
    assert cpu["vLLM weights"].phases == mp.PHASES
    assert cpu["vLLM packed projections"].bytes == (1272 - 80) * 2
    kv_per_token = 2 * 2 * 1 * 4 * 2  # k and v, 2 layers, 1 kv head of 4, bfloat16
    # 128 + 64 = 192 tokens: 2 blocks of 128 per sequence, 256 sequences, vLLM's reserved block
    assert setup.max_model_len == 192
    assert cpu["vLLM KV cache"].bytes == (2 * 256 + 1) * 128 * kv_per_token
    assert "actor full model (template)" not in cpu


def test_a_vllm_share_that_leaves_training_no_room_is_refused_before_the_run():
    from rl_core.controller import check_vllm_share

    spec = load_spec(EXAMPLE_7B, ["rollout.gpu_memory_utilization=0.9"])
    with pytest.raises(InputError, match=r"rollout.gpu_memory_utilization: 0.9 of the device for "
                                         r"vLLM leaves training no room: the rollout phase needs "
                                         r"\d+\.\d GiB of 57.6 usable"):
        check_vllm_share(spec)
    check_vllm_share(load_spec(EXAMPLE_7B))  # the example's 0.5 fits
    result = mp.plan(spec)
    assert result.alternatives[0].change == "rollout.gpu_memory_utilization=0.3"
