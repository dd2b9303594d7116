"""Tiny Qwen2 models: presets, seeded builds, atomic save, plain-HF reload, the tiny: cache."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

from rl_core.models import tiny
from rl_core.models.loading import load_model, load_model_and_tokenizer
from rl_core.models.presets import TINY_SIZES, TinySize, parse_tiny_path
from rl_core.models.tiny import build_tiny, count_parameters, save_tiny, tiny_config

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
}


@pytest.fixture(scope="module")
def nano_folder(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("tiny") / "nano", "nano", seed=3)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENT_CACHE_DIR", str(tmp_path))
    return tmp_path / "tiny"


def test_presets_have_the_documented_parameter_counts():
    counts = {name: count_parameters(build_tiny(name)[0]) for name in TINY_SIZES}
    assert counts == {"nano": 27_136, "small": 1_018_880, "base": 5_971_968,
                      "moe-nano": 39_584, "moe": 3_381_504}


def test_config_is_qwen2_with_the_tokenizer_vocab_and_ids():
    config = tiny_config("small")
    tokenizer = build_tiny("nano")[1]
    assert config.model_type == "qwen2"
    assert config.vocab_size == len(tokenizer)
    assert config.eos_token_id == tokenizer.eos_token_id
    assert config.pad_token_id == tokenizer.pad_token_id
    assert config.tie_word_embeddings


def test_overrides_change_the_shape():
    model, _ = build_tiny("nano", hidden_size=64, num_hidden_layers=3)
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (64, 3)
    assert model.config.num_attention_heads == TINY_SIZES["nano"].num_attention_heads


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"hidden_size": 30}, "not divisible by num_attention_heads"),
        ({"num_key_value_heads": 3}, "not divisible by num_key_value_heads"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
        ({"hidden_size": 12, "num_attention_heads": 4}, "must be even"),
        ({"vocab_size": 10}, "unknown tiny-model field"),
    ],
)
def test_bad_shapes_are_refused_with_the_field_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        build_tiny("nano", **overrides)


def test_unknown_sizes_list_the_presets():
    with pytest.raises(ValueError, match="nano, small, base"):
        build_tiny("huge")
    with pytest.raises(ValueError, match="tiny:huge: unknown tiny model 'huge'; choose one of "
                                         "tiny:nano, tiny:small, tiny:base, tiny:moe-nano, "
                                         "tiny:moe, tiny:vl, tiny:small-addition, "
                                         "tiny:moe-addition, tiny:small-calculator, "
                                         "tiny:vl-squares"):
        parse_tiny_path("tiny:huge")
    assert parse_tiny_path("tiny:small-addition") == "small-addition"
    assert parse_tiny_path("/models/tiny:x") is None
    assert isinstance(TINY_SIZES["small"], TinySize)


def test_same_seed_same_weights_other_seed_other_weights():
    def weights(seed):
        return build_tiny("nano", seed=seed)[0].state_dict()

    a, b, c = weights(1), weights(1), weights(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_building_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny("nano", seed=9)
    assert torch.equal(torch.rand(3), expected)


def test_saved_folder_is_a_complete_hf_folder(nano_folder):
    assert EXPECTED_FILES <= {p.name for p in nano_folder.iterdir()}
    assert not [p for p in nano_folder.parent.iterdir() if p.name.startswith(".")]
    tokenizer_config = json.loads((nano_folder / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "Qwen2Tokenizer"
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    generation = json.loads((nano_folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [258, 256] and generation["pad_token_id"] == 256


def test_plain_from_pretrained_gives_identical_logits(nano_folder):
    built, _ = build_tiny("nano", seed=3)
    loaded = AutoModelForCausalLM.from_pretrained(nano_folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(nano_folder, local_files_only=True)
    assert isinstance(loaded, Qwen2ForCausalLM)
    ids = torch.tensor([tokenizer.encode("<|im_start|>user\n12+34=<|im_end|>")])
    with torch.no_grad():
        assert torch.equal(built(ids).logits, loaded(ids).logits)


def test_loading_in_bfloat16_gives_bf16_parameters(nano_folder):
    model = load_model(nano_folder, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model(torch.tensor([[5, 6, 7]])).logits.dtype == torch.bfloat16


def test_an_existing_folder_is_kept_unless_overwrite(tmp_path):
    out = tmp_path / "m"
    save_tiny(out, "nano", seed=1)
    with pytest.raises(FileExistsError, match=str(out)):
        save_tiny(out, "nano", seed=2)
    save_tiny(out, "nano", seed=2, overwrite=True)
    reloaded = load_model(out)
    expected = build_tiny("nano", seed=2)[0]
    assert torch.equal(reloaded.lm_head.weight, expected.lm_head.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_a_failed_save_leaves_nothing_behind(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tiny, "save_tiny_tokenizer", boom)
    with pytest.raises(OSError, match="disk full"):
        save_tiny(tmp_path / "m", "nano")
    assert list(tmp_path.iterdir()) == []


def test_tiny_path_builds_once_into_the_cache_then_reuses_it(cache, monkeypatch):
    model, tokenizer = load_model_and_tokenizer("tiny:nano")
    (folder,) = cache.iterdir()
    assert folder.name.startswith("nano-seed0-")
    weights = folder / "model.safetensors"
    stamp = weights.stat().st_mtime_ns

    def no_rebuild(*args, **kwargs):
        raise AssertionError("rebuilt a cached tiny model")

    monkeypatch.setattr(tiny, "build_tiny", no_rebuild)
    again, _ = load_model_and_tokenizer("tiny:nano")
    assert weights.stat().st_mtime_ns == stamp
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)
    assert tokenizer.padding_side == "left"


def test_the_cache_key_changes_with_the_preset(monkeypatch):
    key = tiny.tiny_cache_key("nano")
    monkeypatch.setitem(TINY_SIZES, "nano", TINY_SIZES["nano"].replace(intermediate_size=96))
    assert tiny.tiny_cache_key("nano") != key


def test_losing_a_build_race_uses_the_winners_folder(cache, monkeypatch):
    real_build = tiny.build_tiny

    def racing_build(size, seed=0, **overrides):
        # Another process finishes the same cache folder while this one builds.
        winner = cache / tiny.tiny_cache_key(size, seed)
        tiny.write_tiny(*real_build(size, seed), winner)
        return real_build(size, seed)

    monkeypatch.setattr(tiny, "build_tiny", racing_build)
    folder = tiny.resolve_tiny("nano")
    assert [p.name for p in cache.iterdir()] == [folder.name]
    assert (folder / "model.safetensors").is_file()


def test_the_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ASCENT_CACHE_DIR", str(tmp_path / "a"))
    assert tiny.tiny_cache_root() == tmp_path / "a" / "tiny"
    monkeypatch.delenv("ASCENT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert tiny.tiny_cache_root() == tmp_path / "x" / "ascent" / "tiny"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert tiny.tiny_cache_root() == tmp_path / "h" / ".cache" / "ascent" / "tiny"
