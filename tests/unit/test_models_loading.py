"""Loading local Hugging Face causal-LM folders: families, dtypes, offline, and every error."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import (
    BertConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForSequenceClassification,
    Qwen3Config,
    Qwen3ForCausalLM,
    ViTConfig,
)

from rl_core.models.loading import (
    ModelLoadError,
    load_from_spec,
    load_model,
    load_model_and_tokenizer,
    load_tokenizer,
    resolve_dtype,
)
from rl_core.models.tiny import build_tiny, save_tiny
from rl_core.models.tokenizer import build_tiny_tokenizer
from rl_core.spec import ModelConfig

REPO = Path(__file__).resolve().parents[2]
SHAPE = dict(
    vocab_size=263,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("models") / "nano", "nano")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENT_CACHE_DIR", str(tmp_path / "cache"))


def _save_family(folder, model_class, config_class, with_pad=True):
    """A tiny randomly initialised model of another family, with a byte tokenizer."""
    torch.manual_seed(0)
    model_class(config_class(**SHAPE, eos_token_id=258)).save_pretrained(folder)
    tokenizer = build_tiny_tokenizer()
    if not with_pad:
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|im_end|>"
        )
    tokenizer.save_pretrained(folder)
    return folder


def test_a_tiny_folder_loads_as_float32_eval_model_with_left_padding(nano):
    model, tokenizer = load_model_and_tokenizer(nano)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert not model.training
    assert (tokenizer.padding_side, tokenizer.pad_token) == ("left", "<|endoftext|>")
    assert model.config.pad_token_id == tokenizer.pad_token_id


def test_left_padded_batches_generate(nano):
    model, tokenizer = load_model_and_tokenizer(nano)
    batch = tokenizer(["1+1=", "12+34="], padding=True, return_tensors="pt")
    assert batch["input_ids"][0, 0] == tokenizer.pad_token_id  # the shorter prompt, padded left
    out = model.generate(**batch, max_new_tokens=3, do_sample=False)
    assert out.shape[0] == 2 and out.shape[1] <= batch["input_ids"].shape[1] + 3


@pytest.mark.parametrize(
    "dtype, expected", [("bfloat16", torch.bfloat16), ("float16", torch.float16)]
)
def test_dtype_comes_from_the_spec_string(nano, dtype, expected):
    model = load_model(nano, dtype=dtype)
    assert {p.dtype for p in model.parameters()} == {expected}


def test_an_unknown_dtype_lists_the_choices():
    with pytest.raises(ValueError, match="bfloat16, float16"):
        resolve_dtype("fp8")
    assert resolve_dtype(torch.float16) is torch.float16


@pytest.mark.parametrize(
    "model_class, config_class", [(Qwen3ForCausalLM, Qwen3Config), (LlamaForCausalLM, LlamaConfig)]
)
def test_other_families_load(tmp_path, model_class, config_class):
    folder = _save_family(tmp_path / "m", model_class, config_class)
    model, tokenizer = load_model_and_tokenizer(folder, dtype="bfloat16")
    assert type(model) is model_class
    assert model(torch.tensor([tokenizer.encode("1+2=")])).logits.shape == (1, 4, 263)


def test_a_missing_pad_token_falls_back_to_eos(tmp_path):
    folder = _save_family(tmp_path / "llama", LlamaForCausalLM, LlamaConfig, with_pad=False)
    model, tokenizer = load_model_and_tokenizer(folder)
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    assert model.config.pad_token_id == model.generation_config.pad_token_id == 258


def test_the_tokenizer_can_come_from_another_folder(nano, tmp_path):
    weights_only = tmp_path / "weights"
    shutil.copytree(nano, weights_only)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "chat_template.jinja"):
        (weights_only / name).unlink()
    with pytest.raises(ModelLoadError, match=re.escape(f"{weights_only}: no tokenizer files")):
        load_model_and_tokenizer(weights_only)
    model, tokenizer = load_model_and_tokenizer(weights_only, tokenizer_path=nano)
    assert len(tokenizer) == model.config.vocab_size


def test_gradient_checkpointing_is_switched_on(nano):
    model = load_model(nano, gradient_checkpointing=True)
    # transformers 5.20 renamed `is_gradient_checkpointing` to `is_activation_checkpointing`
    name = next(n for n in ("is_activation_checkpointing", "is_gradient_checkpointing")
                if hasattr(model, n))
    assert getattr(model, name) is True
    assert model.config.use_cache is False


def test_the_spec_model_section_loads_a_tiny_model(cache):
    model, tokenizer = load_from_spec(ModelConfig(path="tiny:nano", dtype="bfloat16"))
    assert model.dtype == torch.bfloat16
    assert tokenizer.eos_token == "<|im_end|>"


def test_loading_needs_no_network(nano, tmp_path):
    script = textwrap.dedent(
        f"""
        import socket

        def refuse(*args, **kwargs):
            raise RuntimeError("network access attempted")

        socket.socket.connect = refuse
        socket.create_connection = refuse
        import torch
        from rl_core.models import load_model_and_tokenizer
        for path in ({str(nano)!r}, "tiny:nano"):
            model, tokenizer = load_model_and_tokenizer(path)
            with torch.no_grad():
                logits = model(torch.tensor([tokenizer.encode("1+1=")])).logits
            print(path, tuple(logits.shape))
        """
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "ASCENT_CACHE_DIR": str(tmp_path),
        "HF_HOME": str(tmp_path / "hf"),
    }
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{nano} (1, 4, 263)", "tiny:nano (1, 4, 263)"]


# --------------------------------------------------------------------------- errors


def naming(path, rest):
    """A `match` pattern: the message starts with `path` and goes on with the regex `rest`."""
    return f"^{re.escape(str(path))}: {rest}"


def test_a_missing_folder_is_named(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelLoadError, match=naming(missing, "no such folder")):
        load_model_and_tokenizer(missing)


def test_a_file_is_not_a_folder(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"")
    with pytest.raises(ModelLoadError, match=naming(file, "is a file")):
        load_model(file)


def test_a_folder_without_config_is_named(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=naming(tmp_path, "no config.json.*found: tokenizer")):
        load_model(tmp_path)


def test_a_config_that_is_not_json_is_named(tmp_path):
    config = tmp_path / "config.json"
    config.write_text("{not json")
    with pytest.raises(ModelLoadError, match=naming(config, "cannot read it as JSON")):
        load_model(tmp_path)


@pytest.mark.parametrize(
    "config, found",
    [
        (BertConfig(), "model_type 'bert'"),
        (BertConfig(architectures=["BertForMaskedLM"]), "architectures BertForMaskedLM"),
        (ViTConfig(), "model_type 'vit'"),
    ],
)
def test_an_encoder_or_vision_config_is_refused_saying_what_was_found(tmp_path, config, found):
    config.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        load_model_and_tokenizer(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path}: config.json describes")
    assert found in message
    assert "not a decoder-only causal language model" in message
    assert "qwen2, qwen3, qwen3_moe, llama" in message


def test_a_classification_head_is_refused(tmp_path):
    Qwen2ForSequenceClassification(Qwen2Config(**SHAPE, num_labels=1)).save_pretrained(tmp_path)
    pattern = "config.json describes .*Qwen2ForSequenceClassification.*without a language-model"
    with pytest.raises(ModelLoadError, match=naming(tmp_path, pattern)):
        load_model(tmp_path)


def test_remote_code_needs_trust_remote_code(tmp_path):
    config = {"model_type": "mystery", "auto_map": {"AutoModelForCausalLM": "m.MysteryLM"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=naming(tmp_path, ".*trust_remote_code: true")):
        load_model(tmp_path)


def test_missing_weights_are_named(nano, tmp_path):
    shutil.copy(nano / "config.json", tmp_path / "config.json")
    pattern = "no weights: expected one of model.safetensors"
    with pytest.raises(ModelLoadError, match=naming(tmp_path, pattern)):
        load_model(tmp_path)


def test_missing_shards_are_named(nano, tmp_path):
    shutil.copy(nano / "config.json", tmp_path / "config.json")
    shards = [f"model-0000{i}-of-00002.safetensors" for i in (1, 2)]
    index = {"weight_map": {"a": shards[0], "b": shards[1]}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(nano / "model.safetensors", tmp_path / shards[0])
    pattern = f"weights incomplete: 1 of 2 shards .*{shards[1]}"
    with pytest.raises(ModelLoadError, match=naming(tmp_path, pattern)):
        load_model(tmp_path)


def test_an_unknown_tiny_size_lists_the_sizes():
    with pytest.raises(ModelLoadError, match="^tiny:huge: unknown tiny model .huge.; choose one of .*tiny:small"):
        load_tokenizer("tiny:huge")


def test_the_tiny_tokenizer_and_model_agree(nano):
    model, _ = build_tiny("nano")
    tokenizer = load_tokenizer(nano, padding_side="right")
    assert tokenizer.padding_side == "right"
    assert len(tokenizer) == model.config.vocab_size
