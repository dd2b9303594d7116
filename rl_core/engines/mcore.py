"""Megatron-Core's side of `actor.strategy: megatron`: its parallel state from the spec's
layout, and Hugging Face weights to and from Megatron-Core's `GPTModel` through mbridge.

    layout = MegatronLayout.of(spec)              # tp, pp, vpp, cp, ep from `parallel`
    init_parallel(layout)                         # Megatron's process groups (once a process)
    bridge = make_bridge(folder, "bfloat16")      # mbridge's converter for the folder's model
    chunks = build_model(bridge)                  # a GPTModel per virtual stage, weights loaded
    for name, tensor in export_weights(bridge, chunks):  # Hugging Face names, full tensors
        ...

The extra `megatron` (megatron-core 0.16.0, mbridge 0.15.1) is optional: `require_megatron`
turns its absence into an InputError naming the field and the install. Megatron-Core's layers
run on an accelerator only (its rotary embedding and attention allocate on
`torch.cuda.current_device()`), but a model builds, loads and exports on the CPU: the tests
convert the tiny folders there both ways.

Three adaptations of mbridge 0.15.1, all local to the bridge object `make_bridge` returns:
- without Transformer Engine its layer spec (which asks for Transformer Engine's layers) is
  replaced by Megatron-Core's local layers (`use_transformer_engine=False`), whose separate
  norms are mapped under the names of the fused ones (torch's norms: no sequence parallelism,
  the residual stream is whole on each tensor-parallel rank); with it, mbridge's own spec stands
  (packed THD sequences and context parallelism need it);
- transformers 5 keeps a model's rotary base in `rope_parameters["rope_theta"]`, where mbridge
  reads `rope_theta`: the attribute is set from it on the bridge's copy of the config;
- a tied model's output layer is mapped in the bridge's own copy of the name mapping (mbridge
  writes it into the class's, shared with every later bridge of the family).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import types
from collections.abc import Iterator
from typing import Any

import torch

from rl_core.errors import InputError

EXTRA = "pip install 'ascent[megatron]' (megatron-core 0.16.0 and mbridge 0.15.1)"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def megatron_missing() -> str | None:
    """What of the `megatron` extra this environment lacks ("megatron-core", "mbridge"), or
    None when both import."""
    for module, package in (("megatron.core", "megatron-core"), ("mbridge", "mbridge")):
        try:
            if importlib.util.find_spec(module) is None:
                return package
        except ModuleNotFoundError:
            return package
    return None


def require_megatron(field: str = "actor.strategy") -> None:
    """An InputError naming `field` and the install when the `megatron` extra is missing."""
    missing = megatron_missing()
    if missing:
        raise InputError(f"{field}: megatron needs {missing}, which is not installed here: "
                         f"{EXTRA}, or use actor.strategy: fsdp2")


def adapt_device() -> None:
    """On an Ascend NPU, MindSpeed's adaptor, which points Megatron-Core's CUDA calls and
    kernels at the NPU (imported once, before any Megatron model); an InputError naming
    actor.strategy where it is not installed. Nothing elsewhere."""
    npu = getattr(torch, "npu", None)
    if npu is None or not npu.is_available():
        return
    try:
        importlib.import_module("mindspeed.megatron_adaptor")
    except ImportError as exc:
        raise InputError("actor.strategy: megatron on Ascend NPUs needs MindSpeed (its "
                         "megatron_adaptor runs Megatron-Core on the NPU), which is not "
                         "installed in this image: install mindspeed, or use actor.strategy: "
                         "fsdp2") from exc


def has_transformer_engine() -> bool:
    """Whether NVIDIA's Transformer Engine imports (its layers: packed sequences, context
    parallelism, fused kernels)."""
    try:
        return importlib.util.find_spec("transformer_engine") is not None
    except (ModuleNotFoundError, ValueError):
        return False


@dataclasses.dataclass(frozen=True)
class MegatronLayout:
    """Megatron's model-parallel sizes; the data-parallel size is what the world leaves."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    cp: int = 1
    ep: int = 1

    @classmethod
    def of(cls, spec: Any) -> MegatronLayout:
        p = spec.parallel
        return cls(tp=p.tensor_parallel_size, pp=p.pipeline_parallel_size,
                   vpp=p.virtual_pipeline_parallel_size, cp=p.context_parallel_size,
                   ep=p.expert_parallel_size)

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp


def init_parallel(layout: MegatronLayout, seed: int = 0) -> None:
    """Megatron's process groups over the default group's ranks, in Megatron's order
    (tp fastest, then cp, dp, pp); `torch.distributed` must be initialised. Idempotent for
    the same layout; another layout in the same process is an error (Megatron keeps one)."""
    from megatron.core import parallel_state as mpu

    if mpu.model_parallel_is_initialized():
        now = (mpu.get_tensor_model_parallel_world_size(),
               mpu.get_pipeline_model_parallel_world_size(),
               mpu.get_context_parallel_world_size(), mpu.get_expert_model_parallel_world_size())
        if now != (layout.tp, layout.pp, layout.cp, layout.ep):
            raise RuntimeError(f"Megatron's parallel state is {now} (tp, pp, cp, ep) in this "
                               f"process; {layout} was asked for")
        return
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp if layout.vpp > 1 else None,
        context_parallel_size=layout.cp, expert_model_parallel_size=layout.ep)
    if torch.cuda.is_available():  # Megatron's tensor-parallel RNG tracker (dropout, init)
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def make_bridge(folder: str, dtype: str = "bfloat16", **config: Any) -> Any:
    """mbridge's bridge for the Hugging Face folder's model (its config.json), building
    Megatron-Core models in `dtype` within the current parallel state (`init_parallel`);
    `config`: Megatron `TransformerConfig` fields to set (recomputation, ...). A vocabulary
    the tensor-parallel size does not divide is padded to the next multiple of it (the
    padding's logits are left out of every log-probability: `vocab_size`). An InputError
    naming model.path for a model type mbridge does not convert."""
    from mbridge import AutoBridge
    from megatron.core import parallel_state as mpu
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(folder)
    if not hasattr(hf_config, "rope_theta"):  # transformers 5: rope_parameters["rope_theta"]
        rope = getattr(hf_config, "rope_parameters", None) or {}
        if "rope_theta" in rope:
            hf_config.rope_theta = rope["rope_theta"]
    local = not has_transformer_engine()
    experts = getattr(hf_config, "num_experts", 0) or getattr(hf_config, "n_routed_experts", 0)
    if local and experts:
        raise InputError(f"model.path: {folder} is a mixture of experts, whose experts "
                         "actor.strategy: megatron builds with Transformer Engine's "
                         "grouped layers (the weights' layout mbridge converts), and "
                         "Transformer Engine is not installed here: install "
                         "transformer-engine[pytorch] (the CUDA image has it), or use "
                         "actor.strategy: fsdp2")
    tp = mpu.get_tensor_model_parallel_world_size() if mpu.model_parallel_is_initialized() else 1
    pad = tp if hf_config.vocab_size % tp else None  # the fewest padding rows, cut on export
    try:
        bridge = AutoBridge.from_config(hf_config, dtype=DTYPES[dtype],
                                        make_vocab_size_divisible_by=pad)
    except (ValueError, KeyError) as exc:
        kinds = ", ".join(sorted(AutoBridge.list_supported_models()))
        raise InputError(f"model.path: {folder} is a {hf_config.model_type} model, which "
                         f"actor.strategy: megatron cannot convert ({kinds} it can): "
                         f"{exc}") from exc
    # mbridge maps a tied model's output layer by writing into its class's mapping, which
    # every later bridge of that family (Qwen3 shares Qwen2's) would then read: each bridge
    # gets its own, for its own model
    direct = dict(type(bridge)._DIRECT_MAPPING)
    if "output_layer.weight" in direct:
        tied = getattr(hf_config, "tie_word_embeddings", False)
        direct["output_layer.weight"] = "model.embed_tokens.weight" if tied else "lm_head.weight"
    bridge._DIRECT_MAPPING = direct
    if local:
        bridge._get_transformer_layer_spec = types.MethodType(_local_layer_spec, bridge)
        # torch's norms cannot take a sequence-parallel share: the residual stream stays whole
        config = {"sequence_parallel": False, "persist_layer_norm": False, **config}
        te_names = bridge._weight_name_mapping_mcore_to_hf
        bridge._weight_name_mapping_mcore_to_hf = lambda name: _local_names(te_names, name)
    if not torch.cuda.is_available():  # Megatron allocates on the GPU unless told otherwise
        config = {"use_cpu_initialization": True, **config}
    if config:
        bridge.set_extra_args(**config)
    return bridge


def _local_layer_spec(bridge: Any, vp_stage: int | None = None) -> Any:
    """Megatron-Core's own layers (no Transformer Engine) for `bridge`'s config."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    bridge.has_vp_stage = True  # what mbridge's own spec records: megatron-core 0.16 takes it
    return get_gpt_decoder_block_spec(bridge.config, use_transformer_engine=False,
                                      vp_stage=vp_stage)


# Megatron-Core's local layers keep the norms that Transformer Engine's fuse into the next
# projection: the local name, and the fused one under which mbridge maps it
LOCAL_NORMS = ((".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight"),
               (".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"))


def _local_names(te_names: Any, name: str) -> list[str]:
    """The Hugging Face names of a local layer's weight `name`, through mbridge's mapping of
    Transformer Engine's layers (`te_names`)."""
    try:
        return te_names(name)
    except NotImplementedError:
        for local, fused in LOCAL_NORMS:
            if name.endswith(local):
                return te_names(name.removesuffix(local) + fused)
        raise


def build_model(bridge: Any, folder: str | None = None, *, value: bool = False,
                train: bool = True, distributed_optimizer: bool = True) -> list[Any]:
    """The model chunks of this rank (one per virtual pipeline stage), their weights loaded
    from `folder` when given. `value`: a one-output head in place of the LM head (a critic).
    `train`: wrapped in Megatron's DistributedDataParallel (gradient buffers, reduced over
    the data- and context-parallel ranks by summing; with the distributed optimizer,
    reduce-scattered); frozen otherwise. On the CPU the weights are built there."""
    from megatron.core.distributed import DistributedDataParallelConfig

    on_cpu = not torch.cuda.is_available()
    ddp = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=distributed_optimizer,
        overlap_grad_reduce=False, overlap_param_gather=False)
    chunks = bridge.get_model(
        wrap_with_ddp=train, bf16=bridge.dtype is torch.bfloat16,
        use_cpu_initialization=on_cpu, ddp_config=dataclasses.asdict(ddp),
        # mbridge moves the chunks to the GPU unless they are built on the CPU for FSDP2: on
        # the CPU this flag keeps a frozen model there (without wrap_with_ddp it changes
        # nothing else)
        use_torch_fsdp2=on_cpu and not train,
        post_model_creation_callbacks=[_value_head] if value else [])
    if value:  # the head exports as the one-output head it is (not as the vocabulary's)
        to_hf = bridge._weight_to_hf_format
        bridge._weight_to_hf_format = lambda name, weights: (
            ([VALUE_HEAD[name]], [weights]) if name in VALUE_HEAD else to_hf(name, weights))
    if folder is not None:
        _load_weights(bridge, chunks, folder, skip_head=value)
    if not train:
        for chunk in chunks:
            chunk.requires_grad_(False).eval()
    return chunks


# A value model's head in Hugging Face's names: a token classifier's one-label score layer
VALUE_HEAD = {"output_layer.weight": "score.weight", "output_layer.bias": "score.bias"}


def _value_head(model: Any, pre_process: bool, post_process: bool, config: Any,
                hf_config: Any) -> None:
    """The last stage's output layer replaced by a value head: one output with a bias, as
    transformers' token classifier (`score`), its bias 0; the same on every tensor-parallel
    rank (it is replicated: each computes every value)."""
    if not post_process:
        return
    from mbridge.utils.layer import LinearForLastLayer
    from megatron.core import parallel_state as mpu

    head = LinearForLastLayer(input_size=config.hidden_size, output_size=1, config=config,
                              bias=True)
    torch.nn.init.normal_(head.weight, std=getattr(hf_config, "initializer_range", 0.02))
    torch.nn.init.zeros_(head.bias)
    group = mpu.get_tensor_model_parallel_group()
    if mpu.get_tensor_model_parallel_world_size() > 1:  # tp rank 0's, everywhere
        from rl_core.collectives import all_reduce

        first = mpu.get_tensor_model_parallel_rank() == 0
        with torch.no_grad():
            head.weight.copy_(all_reduce(head.weight.detach() * first, group))
    model.output_layer = head


def _load_weights(bridge: Any, chunks: list[Any], folder: str, skip_head: bool) -> None:
    """The folder's weights into the chunks; `skip_head`: not into the output layer (a value
    model's new head, which keeps its initialisation)."""
    from megatron.core.utils import unwrap_model

    heads = [(model, model.output_layer) for model in unwrap_model(chunks)
             if skip_head and getattr(model, "output_layer", None) is not None]
    for model, _ in heads:
        model.output_layer = None  # out of the state dict mbridge fills
    try:
        bridge.load_weights(chunks, folder)
    finally:
        for model, head in heads:
            model.output_layer = head


def export_weights(bridge: Any, chunks: list[Any]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight in full under its Hugging Face name, one tensor at a time: each is
    gathered from its tensor-, expert- and pipeline-parallel parts as it is reached (every
    rank of the model must iterate alike), never the whole model at once. Across pipeline
    stages mbridge broadcasts through the accelerator (`torch.cuda`, which torch_npu's
    transfer_to_npu maps to the NPU): with pipeline_parallel_size 1 it runs on the CPU too."""
    yield from bridge.export_weights(chunks)


def hf_state_dict(bridge: Any, chunks: list[Any]) -> dict[str, torch.Tensor]:
    """`export_weights` collected on the CPU (for an export of a small model, and tests)."""
    return {name: tensor.detach().cpu() for name, tensor in export_weights(bridge, chunks)}
