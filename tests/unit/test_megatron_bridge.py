"""Hugging Face weights to Megatron-Core's GPTModel and back through mbridge
(`rl_core.engines.mcore`), on the CPU with gloo ranks: every tensor comes back equal, whole on
one rank and split over two tensor-parallel ranks; two pipeline stages each load their layers.
(The model's forward needs an accelerator, and a mixture of experts Transformer Engine's layers:
bench/device_check.py runs them.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ranks import spawn
from safetensors.torch import load_file

from rl_core.engines.mcore import MegatronLayout, megatron_missing, require_megatron
from rl_core.errors import InputError
from rl_core.models.tiny import save_tiny, write_tiny


def qwen3_folder(out: Path) -> Path:
    """nano's sizes in Qwen3's layout (per-head q/k norms, head_dim 12 ≠ 32 / 4, untied)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from rl_core.models.tiny import build_tiny

    base, tokenizer = build_tiny("nano", seed=1)
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
            "rms_norm_eps", "bos_token_id", "eos_token_id", "pad_token_id")
    config = Qwen3Config(**{k: getattr(base.config, k) for k in keys}, head_dim=12,
                         tie_word_embeddings=False)
    torch.manual_seed(3)
    return write_tiny(Qwen3ForCausalLM(config), tokenizer, out, overwrite=True)


def _round_trip(rank: int, folders: list[str], layout: dict, out: str) -> None:
    """Each folder into this rank's Megatron-Core chunks and back: the exported tensors (not
    across pipeline stages, whose broadcast needs an accelerator), and this rank's own."""
    from rl_core.engines.mcore import build_model, hf_state_dict, init_parallel, make_bridge

    init_parallel(MegatronLayout(**layout))
    for i, folder in enumerate(folders):
        bridge = make_bridge(folder, "float32")
        chunks = build_model(bridge, folder, train=False)
        if layout.get("pp", 1) == 1:
            exported = hf_state_dict(bridge, chunks)
            if rank == 0:
                torch.save(exported, f"{out}/{i}.pt")
        local = {name: t.detach() for chunk in chunks for name, t in chunk.named_parameters()}
        torch.save(local, f"{out}/{i}-{rank}.pt")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("megatron-bridge")
    return [save_tiny(root / "nano", "nano", overwrite=True), qwen3_folder(root / "qwen3")]


def converted(tmp_path: Path, folders: list[Path], world: int, **layout) -> list[dict]:
    out = tmp_path / "out"
    out.mkdir()
    spawn(_round_trip, world, tmp_path, [str(f) for f in folders], layout, str(out))
    return [torch.load(out / f"{i}.pt") for i in range(len(folders))
            if (out / f"{i}.pt").exists()]


def own_parts(tmp_path: Path, folder: int, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(tmp_path / "out" / f"{folder}-{rank}.pt")


def assert_equal_weights(exported: dict, folder: Path) -> None:
    original = load_file(str(folder / "model.safetensors"))
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert exported[name].dtype == tensor.dtype, name
        assert torch.equal(exported[name], tensor), name


def test_qwen2_and_qwen3_round_trip_exactly_on_one_rank(tmp_path, folders):
    for exported, folder in zip(converted(tmp_path, folders, 1), folders):
        assert_equal_weights(exported, folder)


def test_two_tensor_parallel_ranks_hold_halves_and_export_the_whole_weights(tmp_path, folders):
    for exported, folder in zip(converted(tmp_path, folders, 2, tp=2), folders):
        assert_equal_weights(exported, folder)
    halves = [own_parts(tmp_path, 1, rank) for rank in (0, 1)]
    name = "decoder.layers.0.self_attention.linear_proj.weight"  # o_proj, split by its input
    hf = load_file(str(folders[1] / "model.safetensors"))
    o_proj = hf["model.layers.0.self_attn.o_proj.weight"]
    assert torch.equal(torch.cat([halves[0][name], halves[1][name]], dim=1), o_proj)
    # Qwen3 nano: 4 heads + 2 × 2 key/value heads of 12, half of them on each rank
    assert list(halves[0]["decoder.layers.0.self_attention.linear_qkv.weight"].shape) == \
        [(4 + 2 * 2) * 12 // 2, 32]


def test_two_pipeline_stages_hold_a_layer_each_loaded_from_the_folder(tmp_path, folders):
    # the untied Qwen3 (Megatron ties embeddings across stages through the accelerator)
    converted(tmp_path, folders[1:], 2, pp=2)
    stages = [own_parts(tmp_path, 0, rank) for rank in (0, 1)]
    hf = load_file(str(folders[1] / "model.safetensors"))
    assert torch.equal(stages[0]["embedding.word_embeddings.weight"],
                       hf["model.embed_tokens.weight"])
    assert torch.equal(stages[1]["output_layer.weight"], hf["lm_head.weight"])
    assert torch.equal(stages[1]["decoder.final_layernorm.weight"], hf["model.norm.weight"])
    for rank, stage in enumerate(stages):  # each stage's one layer is its own of the folder's
        assert sorted({n.split(".")[2] for n in stage if ".layers." in n}) == ["0"]
        assert torch.equal(stage["decoder.layers.0.self_attention.linear_proj.weight"],
                           hf[f"model.layers.{rank}.self_attn.o_proj.weight"])
        assert torch.equal(stage["decoder.layers.0.mlp.linear_fc2.weight"],
                           hf[f"model.layers.{rank}.mlp.down_proj.weight"])


def test_the_extra_is_installed_for_the_tests_and_its_absence_names_the_install(monkeypatch):
    assert megatron_missing() is None  # `make test` installs the megatron extra
    import rl_core.engines.mcore as mcore

    monkeypatch.setattr(mcore, "megatron_missing", lambda: "mbridge")
    with pytest.raises(InputError) as caught:
        require_megatron()
    assert str(caught.value).startswith("actor.strategy: megatron needs mbridge")
    assert "pip install 'ascent[megatron]'" in str(caught.value)


def test_a_mixture_of_experts_without_transformer_engine_is_refused_naming_the_install(tmp_path):
    from rl_core.engines.mcore import has_transformer_engine, make_bridge

    assert not has_transformer_engine()  # a CPU machine
    folder = save_tiny(tmp_path / "moe", "moe-nano")
    with pytest.raises(InputError) as caught:
        make_bridge(str(folder), "float32")
    assert str(caught.value).startswith(f"model.path: {folder} is a mixture of experts")
    assert "transformer-engine[pytorch]" in str(caught.value)
