"""Tiny Qwen2 models with a byte-level tokenizer, built locally for tests and CPU runs.

    model, tokenizer = build_tiny("small", seed=0)        # in memory
    folder = save_tiny("/tmp/tiny-small", "small")         # a Hugging Face folder
    folder = resolve_tiny("small")                         # cached build behind `tiny:small`
    folder = save_tiny_reward_model("/tmp/tiny-rm", "nano")   # a one-label score head over it

A saved folder is a plain Hugging Face causal-LM folder (config.json, generation_config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with the chat template,
special_tokens_map.json): `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` load it with no network and no remote code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.utils import logging as hf_logging

from rl_core.models.presets import TINY_VISION, TinySize, cache_root, get_size
from rl_core.models.tokenizer import (
    CHAT_TEMPLATE,
    EOS_TOKEN,
    PAD_TOKEN,
    VOCAB,
    build_tiny_tokenizer,
    save_tiny_tokenizer,
)

# Bump when the folder layout, tokenizer or initialisation changes: cached builds then rebuild.
TINY_FORMAT = 1
ROPE_THETA = 10000.0


def tiny_config(size: str | TinySize = "small",
                **overrides: int | None) -> Qwen2Config | Qwen3MoeConfig:
    """The config of a tiny model: a preset (or TinySize) with optional shape overrides; a
    Qwen2Config, or a Qwen3MoeConfig for a shape with experts (every layer a sparse MLP, the
    top-k router's weights renormalised, the load-balancing coefficient of Qwen3-MoE)."""
    shape = get_size(size).replace(**overrides)
    common = dict(
        vocab_size=len(VOCAB),  # exactly the tokenizer: no unused logits to sample
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=None,
        eos_token_id=VOCAB.index(EOS_TOKEN),
        pad_token_id=VOCAB.index(PAD_TOKEN),
    )
    if shape.is_moe:
        return Qwen3MoeConfig(
            **dataclasses.asdict(shape), **common,
            head_dim=shape.hidden_size // shape.num_attention_heads,
            norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
            router_aux_loss_coef=0.001, architectures=["Qwen3MoeForCausalLM"])
    return Qwen2Config(**shape.dense_fields(), **common, architectures=["Qwen2ForCausalLM"])


def build_tiny(
    size: str | TinySize = "small", seed: int = 0, **overrides: int | None
) -> tuple[Qwen2ForCausalLM | Qwen3MoeForCausalLM, PreTrainedTokenizerFast]:
    """A freshly initialised tiny model (float32, eval mode) and its tokenizer.

    The same size, overrides and seed give the same weights; the global RNG is left untouched.
    """
    config = tiny_config(size, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = (Qwen3MoeForCausalLM if isinstance(config, Qwen3MoeConfig)
                 else Qwen2ForCausalLM)(config)
    model.generation_config = _generation_config(config)
    tokenizer = build_tiny_tokenizer(config.max_position_embeddings)
    return model.eval(), tokenizer


def _generation_config(config: Qwen2Config) -> GenerationConfig:
    # A response ends at <|im_end|> (chat) or <|endoftext|> (plain text), as in Qwen2.5.
    return GenerationConfig(
        eos_token_id=[config.eos_token_id, config.pad_token_id],
        pad_token_id=config.pad_token_id,
    )


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied input/output embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def count_active_parameters(model: torch.nn.Module) -> int:
    """The parameters one token computes with: of a mixture of experts, only the
    `num_experts_per_tok` experts its router picks (as `count_parameters` for a dense model)."""
    config = model.config
    experts = getattr(config, "num_experts", 0) or 0
    if not experts:
        return count_parameters(model)
    idle = 0
    for module in model.modules():
        if hasattr(module, "gate_up_proj") and hasattr(module, "down_proj") \
                and isinstance(module.down_proj, torch.nn.Parameter):
            per_expert = (module.gate_up_proj.numel() + module.down_proj.numel()) // experts
            idle += per_expert * (experts - config.num_experts_per_tok)
    return count_parameters(model) - idle


def save_tiny(
    out: str | Path,
    size: str | TinySize = "small",
    seed: int = 0,
    overwrite: bool = False,
    **overrides: int | None,
) -> Path:
    """Build a tiny model (see `build_tiny`) and save it at `out` (see `write_tiny`)."""
    model, tokenizer = build_tiny(size, seed, **overrides)
    return write_tiny(model, tokenizer, out, overwrite)


def save_tiny_reward_model(
    out: str | Path,
    size: str | TinySize = "nano",
    seed: int = 0,
    overwrite: bool = False,
    **overrides: int | None,
) -> Path:
    """A tiny reward model at `out` (`reward.reward_model`): the tiny decoder of `size` with a
    one-label score head (Qwen2ForSequenceClassification), seeded as `build_tiny` is, saved with
    the tiny tokenizer (the policy's, so it reads the policy's token ids)."""
    config = tiny_config(size, **overrides)
    config.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
    tokenizer = build_tiny_tokenizer(config.max_position_embeddings)
    return write_tiny(model.eval(), tokenizer, out, overwrite)


def write_tiny(
    model: Qwen2ForCausalLM | Qwen2ForSequenceClassification,
    tokenizer: PreTrainedTokenizerFast,
    out: str | Path,
    overwrite: bool = False,
) -> Path:
    """Save a model from `build_tiny` as a Hugging Face folder at `out`; returns its path.

    The folder is written next to `out` under a temporary name and renamed into place, so
    `out` is either absent or complete. An existing non-empty `out` is a FileExistsError
    unless `overwrite`.
    """
    out = Path(out).expanduser().absolute()
    if _non_empty(out) and not overwrite:
        raise FileExistsError(f"{out}: already exists and is not empty (use --force / overwrite=True to replace it)")
    with _staging_folder(out) as staging:
        _write_folder(model, tokenizer, staging)
        _move_into_place(staging, out, overwrite)
    return out


def _write_folder(
    model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, folder: Path
) -> None:
    with _no_progress_bars():
        model.save_pretrained(folder, safe_serialization=True)
    save_tiny_tokenizer(tokenizer, folder)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def _move_into_place(staging: Path, out: Path, overwrite: bool) -> None:
    if overwrite and _non_empty(out):
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
        staging.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(out)  # replaces an empty folder; fails on a non-empty one


@contextlib.contextmanager
def _staging_folder(out: Path) -> Iterator[Path]:
    """A temporary folder beside `out` (same file system: rename is atomic), removed on exit
    if it was not renamed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; other users (Ray workers) must read it
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _non_empty(path: Path) -> bool:
    return path.exists() and (not path.is_dir() or any(path.iterdir()))


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------- cache


def tiny_cache_root() -> Path:
    """Where `tiny:<size>` builds live: `$ASCENT_CACHE_DIR/tiny`, else
    `$XDG_CACHE_HOME/ascent/tiny`, else `~/.cache/ascent/tiny`."""
    return cache_root() / "tiny"


def tiny_cache_key(size: str, seed: int = 0) -> str:
    """Folder name of a cached build: size, seed and a fingerprint of everything that shapes
    the model (preset, vocabulary, chat template, format version), so a changed preset never
    reuses a stale build."""
    recipe = {
        "format": TINY_FORMAT,
        "shape": get_size(size).dense_fields(),
        **({"vision": dataclasses.asdict(TINY_VISION[size])} if size in TINY_VISION else {}),
        "rope_theta": ROPE_THETA,
        "vocab": VOCAB,
        "chat_template": CHAT_TEMPLATE,
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{size}-seed{seed}-{digest}"


def resolve_tiny(size: str, seed: int = 0) -> Path:
    """The folder of the tiny model `size`, built into the cache on first use and reused after.

    Safe under concurrent callers (several Ray actors on one node): each builds in its own
    staging folder and the first rename wins; the others discard theirs.
    """
    folder = tiny_cache_root() / tiny_cache_key(size, seed)
    if (folder / "config.json").is_file():
        return folder
    with _staging_folder(folder) as staging:
        if size in TINY_VISION:  # a vision-language model and its processor
            from rl_core.models.vision import build_tiny_vl, write_vl_folder

            with _no_progress_bars():
                write_vl_folder(*build_tiny_vl(size, seed), staging)
        else:
            _write_folder(*build_tiny(size, seed), staging)
        try:
            staging.rename(folder)
        except OSError:
            if not (folder / "config.json").is_file():
                raise
    return folder
