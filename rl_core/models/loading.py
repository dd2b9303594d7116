"""Load a causal language model and its tokenizer from a local Hugging Face folder.

    model, tokenizer = load_model_and_tokenizer("/models/Qwen2.5-0.5B", dtype="bfloat16")
    model, tokenizer = load_model_and_tokenizer("tiny:small")     # built once, then cached
    model, tokenizer = load_from_spec(spec.model, device="cpu")

Everything is read with `local_files_only=True`: a path is never looked up on a hub. Before
transformers sees a folder it is checked, so each mistake is one `ModelLoadError` naming the
path: no such folder, no config.json, a config that is not a causal LM (encoder-only,
encoder-decoder, vision, classification heads), no weights, no tokenizer files.

Supported are decoder-only models that `AutoModelForCausalLM` knows (Qwen2, Qwen2.5, Qwen3,
Qwen3-MoE, Llama, Mistral, ... ; the Qwen2, Qwen3-MoE and Llama families are tested), with
`trust_remote_code` folders whose config maps `AutoModelForCausalLM` to shipped code, and the
vision-language models of `TRAINED_VISION_TYPES` (Qwen2.5-VL, loaded by
`AutoModelForImageTextToText`; `load_image_processor` reads their image processor).

Tokenizers come back with a pad token (the eos token when the folder defines none) and left
padding: batched prompts then end at the same column, so every response starts right after
its prompt, which is what generation wants. Training code that pads responses, or packs
sequences, sets its own `padding_side`. Models come back in eval mode on `device`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import (
    AutoImageProcessor,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoTokenizer,
    PreTrainedModel,
)
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
)
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from rl_core.errors import InputError
from rl_core.models.presets import WARM_BASES, parse_tiny_path
from rl_core.models.tiny import resolve_tiny

if TYPE_CHECKING:
    from rl_core.spec import ModelConfig

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")

# Model types AutoModelForCausalLM loads that are decoder-only language models. The causal-LM
# mapping also lists encoders (BertLMHeadModel) and encoder-decoders (BartForCausalLM), which
# would load as a decoder with fresh cross-attention or a half-trained head: refuse those.
CAUSAL_LM_TYPES = frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) - frozenset(
    MODEL_FOR_MASKED_LM_MAPPING_NAMES
) - frozenset(MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES)
_CAUSAL_LM_CLASSES = frozenset(
    name
    for names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()
    for name in ((names,) if isinstance(names, str) else names)
)
_TESTED = "qwen2, qwen3, qwen3_moe, llama"
# Image-text-to-text models (Qwen2.5-VL, ...): named as such when a run is given one.
VISION_LANGUAGE_TYPES = frozenset(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
# Those rl_core trains (their image inputs and 3-D positions: rl_core.models.vision).
TRAINED_VISION_TYPES = ("qwen2_5_vl",)


class ModelLoadError(InputError):
    """A model or tokenizer folder that cannot be loaded; the message starts with its path."""


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`"bfloat16"` -> torch.bfloat16 (the spec's `model.dtype` names); a torch.dtype as is."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}") from None


def resolve_model_path(path: str | Path) -> Path:
    """A local folder for `path`: `tiny:<size>` is built (or found) in the tiny-model cache;
    anything else is taken as a folder path (`~` expanded). Existence is not checked here. A
    warm start `tiny:<name>` is resolved by the recipes (rl_core.recipes.warm) before this."""
    try:
        size = parse_tiny_path(str(path))
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    if size in WARM_BASES:  # trained by the SFT recipe, which sits above this module
        raise ModelLoadError(
            f"{path}: a warm start, made on first use by the training commands (python -m "
            "rl_core train / sft / eval, which put its folder in the spec before any model "
            "loads: rl_core.recipes.warm.with_model_folders); load that folder instead")
    if size is not None:
        return resolve_tiny(size)
    return Path(path).expanduser().absolute()


# --------------------------------------------------------------------------- checks


def check_model_folder(path: str | Path, trust_remote_code: bool = False) -> dict[str, Any]:
    """The parsed config.json of a loadable causal-LM folder; ModelLoadError otherwise."""
    folder = _existing_folder(path)
    config = _read_config(folder)
    _check_causal_lm(folder, config, trust_remote_code)
    _check_weights(folder)
    return config


def _existing_folder(path: str | Path) -> Path:
    folder = Path(path)
    if not folder.exists():
        raise ModelLoadError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: is a file, not a folder")
    return folder


def _read_config(folder: Path) -> dict[str, Any]:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelLoadError(
            f"{folder}: no config.json, so not a Hugging Face model folder "
            f"(found: {_listing(folder)})"
        )
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{config_path}: cannot read it as JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(
            f"{config_path}: expected a JSON object, found {type(config).__name__}"
        )
    return config


def _check_causal_lm(folder: Path, config: dict[str, Any], trust_remote_code: bool) -> None:
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    found = f"model_type {model_type!r}" + (
        f", architectures {', '.join(architectures)}" if architectures else ""
    )
    remote = "AutoModelForCausalLM" in (config.get("auto_map") or {})
    if remote:
        if not trust_remote_code:
            raise ModelLoadError(
                f"{folder}: {found} ships its own model code; set model.trust_remote_code: "
                "true to run it"
            )
        return
    if model_type in VISION_LANGUAGE_TYPES:
        if model_type not in TRAINED_VISION_TYPES:
            raise ModelLoadError(
                f"{folder}: config.json describes {found}, a vision-language model of a kind "
                f"rl_core does not train yet; supported: {', '.join(TRAINED_VISION_TYPES)}")
        return
    if model_type not in CAUSAL_LM_TYPES or config.get("is_encoder_decoder"):
        raise ModelLoadError(
            f"{folder}: config.json describes {found}, which is not a decoder-only causal "
            f"language model; supported: model types AutoModelForCausalLM loads as decoders "
            f"(tested: {_TESTED}), or remote code with model.trust_remote_code"
        )
    heads = [a for a in architectures if _is_causal_lm_class(a)]
    if architectures and not heads:
        raise ModelLoadError(
            f"{folder}: config.json describes {found}, a model without a language-model head "
            "(e.g. a reward or value model); expected an architecture like "
            "Qwen2ForCausalLM or LlamaForCausalLM"
        )


def _is_causal_lm_class(name: str) -> bool:
    return name in _CAUSAL_LM_CLASSES or name.endswith(("ForCausalLM", "LMHeadModel"))


def _check_weights(folder: Path) -> None:
    present = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not present:
        raise ModelLoadError(
            f"{folder}: no weights: expected one of {', '.join(WEIGHT_FILES)} "
            f"(found: {_listing(folder)})"
        )
    index_name = next((name for name in present if name.endswith(".index.json")), None)
    if index_name and not any(name.endswith((".safetensors", ".bin")) for name in present):
        _check_shards(folder, index_name)


def _check_shards(folder: Path, index_name: str) -> None:
    try:
        index = json.loads((folder / index_name).read_text(encoding="utf-8"))
        shards = sorted(set(index["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ModelLoadError(f"{folder / index_name}: not a weight index: {exc}") from exc
    missing = [shard for shard in shards if not (folder / shard).is_file()]
    if missing:
        raise ModelLoadError(
            f"{folder}: weights incomplete: {len(missing)} of {len(shards)} shards listed in "
            f"{index_name} are missing ({_first(missing, 3)})"
        )


def check_tokenizer_folder(path: str | Path) -> Path:
    """`path` if it holds tokenizer files; ModelLoadError otherwise."""
    folder = _existing_folder(path)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(
            f"{folder}: no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)}); "
            "point model.tokenizer_path at the tokenizer's folder"
        )
    return folder


def _listing(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir())
    return _first(names, 8) if names else "the folder is empty"


def _first(names: list[str], limit: int) -> str:
    """Up to `limit` names, and how many there are when some were left out."""
    more = f", ... ({len(names)} in all)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


# --------------------------------------------------------------------------- loading


def load_tokenizer(
    path: str | Path, trust_remote_code: bool = False, padding_side: str = "left"
) -> PreTrainedTokenizerBase:
    """The tokenizer in `path` (a folder or `tiny:<size>`), with a pad token and `padding_side`
    (left by default, for generation)."""
    folder = check_tokenizer_folder(resolve_model_path(path))
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            folder, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{folder}: cannot load the tokenizer: {_one_line(exc)}") from exc
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelLoadError(f"{folder}: the tokenizer defines neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = padding_side
    return tokenizer


def load_model(
    path: str | Path,
    dtype: str | torch.dtype = "float32",
    trust_remote_code: bool = False,
    device: str | torch.device = "cpu",
    gradient_checkpointing: bool = False,
) -> PreTrainedModel:
    """The causal LM in `path` (a folder or `tiny:<size>`), in `dtype`, on `device`, in eval
    mode; with `gradient_checkpointing`, activations are recomputed in backward (and the KV
    cache is off)."""
    torch_dtype = resolve_dtype(dtype)
    folder = resolve_model_path(path)
    config = check_model_folder(folder, trust_remote_code)
    auto = (AutoModelForImageTextToText if config.get("model_type") in VISION_LANGUAGE_TYPES
            else AutoModelForCausalLM)
    try:
        model = auto.from_pretrained(
            folder, dtype=torch_dtype, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{folder}: cannot load the model: {_one_line(exc)}") from exc
    if gradient_checkpointing:
        _enable_checkpointing(model)
    return model.to(device).eval()


def _enable_checkpointing(model: PreTrainedModel) -> None:
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.20
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


# What a vision-language folder holds besides the model and its tokenizer: copied into every
# folder saved from it (checkpoints, exports, warm starts), so each loads as its source did.
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "chat_template.json")


def copy_processor_files(source: str | Path, folder: str | Path) -> None:
    """The processor files (`PROCESSOR_FILES`) of the model folder `source`, into `folder`."""
    import shutil

    source = resolve_model_path(source)
    for name in PROCESSOR_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, Path(folder) / name)


def is_vision_language(path: str | Path) -> bool:
    """Whether the model folder (or `tiny:` preset) at `path` is a vision-language model."""
    folder = resolve_model_path(path)
    return _read_config(_existing_folder(folder)).get("model_type") in VISION_LANGUAGE_TYPES


def load_image_processor(path: str | Path, trust_remote_code: bool = False) -> Any:
    """The image processor of a vision-language model folder (its preprocessor_config.json)."""
    folder = _existing_folder(resolve_model_path(path))
    try:
        return AutoImageProcessor.from_pretrained(folder, local_files_only=True,
                                                  trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{folder}: cannot load the image processor: "
                             f"{_one_line(exc)}") from exc


def load_model_and_tokenizer(
    path: str | Path,
    dtype: str | torch.dtype = "float32",
    tokenizer_path: str | Path | None = None,
    trust_remote_code: bool = False,
    device: str | torch.device = "cpu",
    gradient_checkpointing: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model in `path` and the tokenizer in `tokenizer_path` (default: `path`).

    The model folder is checked first, so its errors win over the tokenizer's. The model's pad
    token id is set from the tokenizer where the folder left it empty.
    """
    check_model_folder(resolve_model_path(path), trust_remote_code)
    tokenizer = load_tokenizer(tokenizer_path or path, trust_remote_code)
    model = load_model(path, dtype, trust_remote_code, device, gradient_checkpointing)
    for config in (model.config, model.generation_config):
        if config is not None and getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def load_from_spec(
    model_config: ModelConfig, device: str | torch.device = "cpu"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """`load_model_and_tokenizer` with the fields of the run spec's `model` section."""
    return load_model_and_tokenizer(
        model_config.path,
        dtype=model_config.dtype,
        tokenizer_path=model_config.tokenizer_path,
        trust_remote_code=model_config.trust_remote_code,
        device=device,
        gradient_checkpointing=model_config.gradient_checkpointing,
    )


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
