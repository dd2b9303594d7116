"""LoRA adapters on the policy (`actor.lora`, with PEFT): the wrap, the reference as the base
with its adapters off, and the merged weights that the rollout and the saved folders get.

    model = with_adapters(model, spec.actor.lora)   # PEFT's LoRA layers; only they train
    with adapters_off(model):                       # the frozen base: the reference's log-probs
        ...
    for name, tensor in merged_weights(model):      # W + (alpha / rank) · B A, the base's names
        ...
    save_adapters(model, folder, adapter_state(model))   # PEFT's format: adapter_config.json,
                                                         # adapter_model.safetensors

`with_adapters` wraps a Hugging Face model with `peft.get_peft_model` (PEFT's default
initialisation: A random, B zero, so the wrapped model starts equal to the base): every base
parameter is frozen, each targeted linear layer gets a pair A (rank × in), B (out × rank) in
the base's dtype, and the training engines step those only. The reference needs no second
copy: `adapters_off` runs the same model with every adapter skipped, which is the base exactly
(the base weights are never modified: adapters are not merged into them in place).

`merged_weights` yields the full weights under the base model's own Hugging Face names (no
PEFT prefixes, no adapter entries), each targeted layer's weight merged as
W + (alpha / rank) · B A, computed in float32 and cast back to W's dtype: what a rollout engine
(native or vLLM) and `save_pretrained` take unchanged. Sharded tensors (FSDP2 DTensors) are
gathered by the caller's `full`, tensor by tensor.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from rl_core.errors import InputError

ADAPTER_DIR = "adapter"  # a checkpoint's adapters in PEFT's format, beside the merged model
# state-dict names of adapter tensors (PEFT's LoRA layers), not the base's
_ADAPTER_PARTS = (".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.",
                  ".lora_magnitude_vector.")

Full = Callable[[str, torch.Tensor], torch.Tensor]


def _as_is(name: str, tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def with_adapters(model: torch.nn.Module, lora: Any) -> torch.nn.Module:
    """`model` wrapped by PEFT with LoRA adapters of `lora` (the spec's `actor.lora`: rank,
    alpha, target_modules, dropout), in place (the targeted layers are replaced inside
    `model`); an InputError naming actor.lora.target_modules when none of its layers match."""
    from peft import LoraConfig, get_peft_model

    targets = lora.target_modules
    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=targets if isinstance(targets, str) else list(targets),
                        bias="none")
    try:
        # adapters in the base's dtype: the engine's master weights keep float32 copies
        return get_peft_model(model, config, autocast_adapter_dtype=False)
    except ValueError as exc:
        if "target modules" not in str(exc).lower() and "target_modules" not in str(exc):
            raise
        names = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                        if isinstance(module, torch.nn.Linear)})
        raise InputError(f"actor.lora.target_modules: {targets} matches no linear layer of "
                         f"{type(model).__name__}; its linear layers are named "
                         f"{', '.join(names[:12])}") from exc


def is_adapted(model: Any) -> bool:
    """Whether `model` is wrapped with PEFT adapters (by `with_adapters`)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def base_of(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a PEFT wrapper (with its adapter layers); `model` itself
    when it is not wrapped."""
    return model.get_base_model() if is_adapted(model) else model


def adapters_off(model: torch.nn.Module) -> Any:
    """A context in which `model` computes as its base (every adapter skipped): the reference.
    Nothing to do for a model without adapters."""
    return model.disable_adapter() if is_adapted(model) else contextlib.nullcontext()


def _lora_layers(base: torch.nn.Module) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: module for name, module in base.named_modules()
            if isinstance(module, LoraLayer)}


def merged_weights(model: torch.nn.Module, full: Full = _as_is
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of the base's state dict under its Hugging Face name, each targeted
    layer's W merged with its adapters: W + (alpha / rank) · B A (in float32, cast to W's
    dtype). `full(name, tensor)`: the whole tensor of a (sharded) one, called in the same order
    on every rank."""
    base = base_of(model)
    layers = _lora_layers(base)
    for name, tensor in base.state_dict().items():
        if any(part in name for part in _ADAPTER_PARTS):
            continue
        owner, _, leaf = name.rpartition(".")
        layer_name = owner.removesuffix(".base_layer")
        if owner == layer_name or layer_name not in layers:
            yield name, full(name, tensor)
            continue
        tensor = full(name, tensor)
        if leaf == "weight":
            tensor = _merged(layers[layer_name], layer_name, tensor, full)
        yield f"{layer_name}.{leaf}", tensor


@torch.no_grad()
def _merged(layer: Any, name: str, weight: torch.Tensor, full: Full) -> torch.Tensor:
    """W + scale · B A of one layer's active adapters (out × in, as W)."""
    merged = weight.float()
    for adapter in layer.active_adapters:
        if adapter not in layer.lora_A:
            continue
        a = full(f"{name}.lora_A.{adapter}.weight", layer.lora_A[adapter].weight)
        b = full(f"{name}.lora_B.{adapter}.weight", layer.lora_B[adapter].weight)
        if getattr(layer, "fan_in_fan_out", False):  # W stored (in × out): (B A)^T = A^T B^T
            b, a = a.T, b.T
        merged = torch.addmm(merged, b.float(), a.float(), alpha=layer.scaling[adapter])
    return merged.to(weight.dtype)


def adapter_names(model: torch.nn.Module) -> list[str]:
    """The state-dict names of the trained adapter tensors, in order."""
    return [name for name, param in model.named_parameters() if param.requires_grad]


def adapter_state(model: torch.nn.Module, full: Full = _as_is) -> dict[str, torch.Tensor]:
    """The adapters' tensors by their state-dict names, whole (`full` gathers sharded ones: a
    collective, every rank calls it)."""
    params = dict(model.named_parameters())
    return {name: full(name, params[name].detach()) for name in adapter_names(model)}


def load_adapter_state(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `adapter_state` output into the adapters (an InputError when they differ)."""
    params = dict(model.named_parameters())
    names = adapter_names(model)
    wrong = sorted(set(names) ^ set(state)) or [
        n for n in names if tuple(state[n].shape) != tuple(params[n].shape)]
    if wrong:
        raise InputError(f"actor.lora: the checkpoint's adapters are not this run's (e.g. "
                         f"{wrong[0]}): resume with the actor.lora it was saved with")
    with torch.no_grad():
        for name in names:
            params[name].copy_(state[name].to(params[name].device, params[name].dtype))


def save_adapters(model: torch.nn.Module, folder: str | Path,
                  state: Mapping[str, torch.Tensor]) -> None:
    """The adapters `state` (from `adapter_state`) as PEFT writes them: adapter_config.json and
    adapter_model.safetensors in `folder`, loadable with `PeftModel.from_pretrained`."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = get_peft_model_state_dict(model, state_dict=dict(state))
    save_file({name: t.detach().cpu().contiguous() for name, t in tensors.items()},
              str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = model.peft_config["default"].to_dict()
    config["target_modules"] = (sorted(config["target_modules"])
                                if isinstance(config["target_modules"], (set, list, tuple))
                                else config["target_modules"])
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2, default=str))


def check_resumed(state: Mapping[str, Any], adapted: bool) -> None:
    """An InputError naming actor.lora when a checkpoint's engine state was saved with
    adapters and this engine has none, or the other way round."""
    saved = bool(state.get("lora", False))
    if saved != adapted:
        raise InputError("actor.lora: the checkpoint was saved " + (
            "with LoRA adapters; resume it with the same actor.lora" if saved else
            "by full fine-tuning; resume it without actor.lora, or start afresh "
            "(trainer.resume_mode: disable)"))
