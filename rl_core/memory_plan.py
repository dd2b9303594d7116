"""The memory plan of a run: bytes per device of every part of it, before anything starts.

    shape = shape_of(spec)                       # config.json, a tiny preset or a known model
    result = plan(spec, shape)                   # device memory from the spec's device kind
    print(format_table(result))                  # or result.to_dict() for the API
    python -m rl_core plan SPEC.yaml [KEY=VALUE ...] [--device-memory-gb 64] [--json]  # rl_core.cli.plan

This module imports only the standard library, the spec and the tiny-model presets (the web
process plans a submission without torch). Every figure is bytes per device: a data-parallel
rank of each role, all roles colocated on the same devices as `rl_core.roles.cluster` places
them; with a rollout pool of its own (`parallel.rollout_devices`) a pool device holds the
rollout (the policy's copy and the engine's memory) and a training device the rest, each kind
planned apart, and the plan's peak is the larger (`MemoryPlan.peak_device`). Sizes are in GiB (2**30 bytes), the unit in which npu-smi and nvidia-smi report device
memory; "GB" in the device tables below means the same.

What each engine keeps (P parameters, D = `spec.data_parallel_size` devices, b the bytes of
`model.dtype`):

- `actor.strategy: torch` keeps the parameters in `model.dtype` (P·b). In float32, or in
  bfloat16 with `actor.master_weights: false`, gradients are in that dtype during the update
  (P·b) and AdamW's two moments too (2·P·b: `torch.optim.AdamW` allocates them like the
  parameter). In bfloat16 with master weights (the default) a float32 master copy (4·P) lives
  from load on, the gradients accumulate into float32 ones (4·P; each bfloat16 gradient is freed
  as soon as it is added) and the moments are float32 (8·P). With more than one rank the
  gradients are summed through one flattened copy (of the gradients' dtype) before the step.
- `actor.strategy: fsdp2` keeps float32 master parameters, float32 gradients and two float32
  moments, each sharded over the D ranks (4·P/D, 4·P/D, 8·P/D), and computes in `model.dtype`:
  the layer being run and the next one are gathered in full (2 layers·b), the root (embeddings,
  final norm, output head) stays gathered from forward to backward, and each layer's gradient
  is reduced in float32. The engine shards a copy of the model held on the host: it is loaded
  there in `model.dtype` and cast to float32 (P·(b + 4) of host memory until sharding ends),
  and `fully_shard` moves each unit (a decoder layer, then the root) to the device as it shards
  it. At load the device holds the rollout's full model (P·b), the shards made so far and the
  float32 unit being sharded (the larger of a layer and the root). Generation needs the full
  weights (P·b): the native rollout's own copy, which on an accelerator is parked in host
  memory from the log-prob stages to the weight sync after the step (on cpu it stays).
- `actor.strategy: megatron` (Megatron-Core, the model built from the Hugging Face folder by
  mbridge) keeps on a device its pipeline stage's part of the model. With t, p, v, c and e the
  tensor-, pipeline-, virtual-pipeline-, context- and expert-parallel sizes (`parallel.*`) and
  L the decoder layers, a stage holds L/p layers (v chunks of L/(p·v) when interleaved), the
  first also the embedding, the last the final norm and the output head (with tied embeddings
  and p > 1 a copy of the embedding as its output layer); the stage with the most parameters is
  planned. Its dense weights are split t ways and its experts t·e ways (expert tensor
  parallelism is t). Megatron's defaults: the weights in `model.dtype` (Float16Module), a
  float32 gradient buffer as large (`grad_reduce_in_fp32`), which DistributedDataParallel
  allocates with the model and keeps, and the distributed optimizer's shard of float32 main
  parameters (below float32; in float32 the weights are their own) and Adam's two float32
  moments, over the data- and context-parallel ranks (D·c) for dense weights and over D·c/e
  for experts (and one moment-sized buffer of the step). `actor.offload.optimizer` keeps that
  shard in host memory outside the step. At load the bridge reads each tensor whole from the
  folder and scatters it (the largest, in `model.dtype`, on the device besides); after every
  update the weights go to the rollout one full tensor at a time, gathered over the tensor-,
  expert- and pipeline-parallel ranks (one bucket, the largest tensor, in the rollout phase).
  The rollout keeps its own full copy as with fsdp2.
- `actor.lora` (LoRA adapters of rank r): A adapter parameters (`lora_parameters`: r·(in + out)
  per targeted linear layer, the attention and dense MLP projections) are trained, the base is
  frozen. The plain engine keeps the base and the adapters in `model.dtype` ((P + A)·b) and
  gradients, AdamW moments and float32 masters of the adapters only (A in place of P above);
  fsdp2 shards base and adapters as float32 masters ((P + A)·4/D) with gradients and moments
  of the adapters only. There is no reference model (the actor's base, its adapters off, is
  the reference: its log-prob forward runs in the actor). The plain engine's native rollout
  then keeps its own full copy of the merged weights (P·b), as with fsdp2.
- `actor.offload.param` (fsdp2): the shards of parameters, gradients and moments stay in host
  memory and the optimizer steps there; only the gathered layers come to the device.
  `actor.offload.optimizer`: the moments wait in host memory and come back for the step. The
  plain engine needs its parameters on the device in every phase, so offloading them saves
  nothing there.
- The reference keeps only parameters (P·b); with `reference.offload` they wait in host memory
  and come to the device for its log-prob stage. Under `actor.strategy: fsdp2` it is sharded
  in `model.dtype` (P·b/D, no float32 masters, gradients or moments) and gathers the root and
  two layers to compute; with `reference.offload` the shards stay in host memory (on cpu
  nothing is offloaded: the device is the host). Under `actor.strategy: megatron` it is built
  like the actor's stage and frozen: its stage's weights in `model.dtype` (1/t, experts
  1/(t·e)), no gradients or optimizer, with `reference.offload` in host memory outside its
  stage. The critic (PPO) is the policy's body under a one-output head and keeps parameters,
  gradients and moments like the actor (same strategy, no offload, no gradient checkpointing:
  the critic loads without it; under megatron its last stage holds the final norm and the
  score layer). A reward model (`reward.reward_model`) is frozen and whole on every device
  (its own shape, read from its config.json where the folder is readable here, else the
  policy's) and scores in the `log-probs` phase.

Phases. Memory is added up per phase, and the peak is the largest phase: `load` (roles build
their models), `rollout` (native generation: static KV cache, the fast decoder's packed
weights; with `rollout.engine: vllm`, and with `auto` on gpu and npu (`planned_engine`: the run
takes vLLM there where it is importable, and the native engine where vLLM's share would not fit
beside training and the native engine's does), vLLM's weights and KV cache, which on an accelerator
take `rollout.gpu_memory_utilization` of the device in this phase only, vLLM sleeping in the
others), `log-probs` (the reference, old log-probs, values and reward-model stages run at
once),
`backward` (actor and critic updates run at once) and `step` (gradient reduction and AdamW).
The rollout generates the larger of a training batch and, when `trainer.eval_every` is set, a
validation batch. The fast decoder copies q/k/v and gate/up into fused weights; on CPU it also
keeps oneDNN's prepacked copy of the output and down projections (elsewhere it reads those in
place), so there every layer weight is held twice while generating.

Activations (bytes per token of a micro-batch, per decoder layer) follow Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models" (2022), whose GPT count is
s·b·h·(34 + 5·a·s/h) with 16-bit activations. Adapted to Llama/Qwen decoders with the sdpa
attention of transformers (no s×s attention matrix is stored; no dropout), with b the
activation bytes, h the hidden size, q the query width (heads × head_dim) and I the MLP width:

    2·(4 + b)·h     two RMSNorms: the float32 upcast of the input and the normalised output
    5·b·q           attention: q, k, v (repeated to every head), the attention output and the
                    output projection's input
    4·b·I           SwiGLU MLP: gate output, SiLU output, up output, their product

(b = 2: 12h + 10q + 8I, against the paper's 34h for h = q and I = 4h with dropout and
LayerNorm.) `eager` attention adds the paper's s² term a·s·(4 + b) per token. With gradient
checkpointing each layer keeps only its input (b·h) and one layer is recomputed in full during
backward. On top: the final norm and the output head's input ((4 + 2b)·h) and the gradients in
flight through the layer being back-propagated (b·(2h + 2I)). Micro-batches are counted with
sequences at full length (max_prompt_length + max_new_tokens); with `actor.use_dynamic_bsz` a
micro-batch holds `max_token_len_per_gpu // length` such rows.

Tensor parallelism (`parallel.tensor_parallel_size` t, with fsdp2): FSDP2 shards each
tensor-parallel part over the other devices, so a device still holds 1/devices of the training
state; what it gathers to compute (a layer, the root, their gradients) is 1/t of it. Activations
are split t ways (sequence parallelism for the norms and the residual stream, heads and MLP width
for the rest), except the gathered inputs of attention and the MLP (2·b·h a layer) and of the
output head, which their column-parallel projections keep whole for backward; each device
computes the logits of 1/t of the vocabulary.

Pipeline parallelism (`actor.strategy: megatron`): activations are those of one device's
layers, split t ways (sequence parallelism; conservatively as fsdp2's tensor parallelism above,
the gathered inputs whole) and c ways (tokens). Under the 1F1B schedule the first stage holds p
micro-batches in flight, each through its L/p layers: L layers' worth of one micro-batch, as
without a pipeline; the interleaved schedule (v > 1) holds (1 + (p - 1)/(p·v)) times as much.
`actor.recompute: full` keeps each layer's input and recomputes one layer at a time in backward
(as gradient checkpointing); `selective` drops what the attention core keeps for its backward
(its output, b·q, and with `eager` attention the s² term); null follows
`model.gradient_checkpointing` (full when it is on). The logits are the last stage's, 1/t of
the vocabulary. A device is planned, conservatively, with the largest stage's weights, the
first stage's activations and the last stage's logits together.

A rollout group (`rollout.tensor_parallel_size` r): with the native engine (and fsdp2) each
device holds 1/r of the layers' weights (the embedding, norms and head whole), of the fast
decoder's packed copies, of the KV cache (its key/value heads) and of the prefill's projections;
with vLLM 1/r of all its weights and of its KV cache; the group generates the prompts of r
devices together.

Logits of a micro-batch: rows × response length × vocabulary elements in `model.dtype` from the
output head, and in training their gradient, as large; the log-probs and entropy are computed a
chunk of positions at a time (`rl_core.algos.entropy.chunked_logprobs`), whose float32 buffers
take at most `LOGPROB_CHUNK_BYTES` more.

Not counted: the runtime context of each process, the allocator's fragmentation and the
communication buffers. A plan fits when its peak stays within (1 - HEADROOM_FRACTION) of the
device's memory.

On CPU the device is the host and a figure is the process's resident set above its imports.
Against two GRPO steps of 24M to 147M parameter models (tests/training/test_memory_plan_measured.py,
figures in bench/README.md) the peak is 2 to 12 % below the measured one when glibc gives freed
blocks back (`MALLOC_MMAP_THRESHOLD_=65536`); the rest is the runtime context (code pages, the
heap's small blocks, gloo with fsdp2), about 50 to 90 MiB. With glibc's default threshold, which
rises as large blocks are freed, its heap keeps freed tensors for reuse and a run holds 7 to 25 %
more than the plan.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_core.errors import InputError
from rl_core.models.presets import TINY_PREFIX, TINY_VISION, WARM_BASES, get_size  # torch-free
from rl_core.spec import RunSpec, planned_engine

GIB = 2**30
# rl_core.algos.entropy.LOGPROB_CHUNK_BYTES (that module imports torch; this one must not)
LOGPROB_CHUNK_BYTES = 256 * 2**20
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
PHASES = ("load", "rollout", "log-probs", "backward", "step")
# the kinds of device a plan covers: every device trains, or a rollout pool of its own has its own
DEVICES = ("training", "pool")
# Sequences vLLM's KV cache is sized for on the CPU (each up to max_model_len tokens), in
# blocks of VLLM_CPU_BLOCK tokens (vLLM's CPU default), one block reserved by vLLM.
VLLM_CPU_MAX_SEQS = 256
VLLM_CPU_BLOCK = 128


def vllm_max_model_len(spec: RunSpec) -> int:
    """`rollout.max_model_len`, or the longest prompt plus the longest response."""
    return spec.rollout.max_model_len or spec.data.max_prompt_length + spec.rollout.max_new_tokens


def vllm_cpu_kv_tokens(length: int, sequences: int) -> int:
    """Token slots of a CPU KV cache holding `sequences` sequences of `length` tokens."""
    return VLLM_CPU_BLOCK * (-(-length // VLLM_CPU_BLOCK) * sequences + 1)
TRAINED = PHASES[1:]  # phases after the first optimizer step has made the moments
HEADROOM_FRACTION = 0.10  # kept free for runtime contexts, fragmentation and collectives

# Device memory in GB (GiB, as the device tools report it) by the device models of the
# platform's inventory (`platform.clusters.choices.DeviceType`). A 910C package holds two dies
# of 64 GB that the runtime shows as two devices: memory and `resources.devices_per_node` count
# dies. A CPU has no device memory: no verdict without an explicit size.
DEVICE_MEMORY_GB: dict[str, float | None] = {
    "ascend-910b": 64,
    "ascend-910c": 64,  # per die (the package: 128 GB over two devices)
    "nvidia-a100": 80,
    "nvidia-a100-40gb": 40,
    "nvidia-h100": 80,
    "nvidia-h200": 141,
    "cpu": None,
}
# The device model assumed for a device kind when nothing else says: the dispatcher assumes
# a 910B for an NPU node without an `npu_model` label; a GPU's model is not guessed.
DEFAULT_DEVICE_MODEL = {"npu": "ascend-910b", "gpu": None, "cpu": "cpu"}
DEVICE_NOUN = {"npu": "NPU", "gpu": "GPU", "cpu": "device"}

# The tiny models' byte vocabulary: 256 bytes, 3 special tokens and 4 format tags
# (`len(rl_core.models.tokenizer.VOCAB)`, which imports the tokenizers library).
TINY_VOCAB_SIZE = 263
# ... and a tiny vision-language model's: 3 vision tokens more (`rl_core.models.vision.VL_VOCAB`)
TINY_VL_VOCAB_SIZE = TINY_VOCAB_SIZE + 3
# The fast decoder's static cache rounds its length up to this (`_StaticCache.ROUND`).
KV_LENGTH_ROUND = 64


# --------------------------------------------------------------------------- model shape


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama/Qwen-style decoder that memory depends on (config.json names).

    `head_dim` defaults to hidden_size / num_attention_heads; `qkv_bias` is Qwen2's bias on the
    q, k, v projections (Llama's `attention_bias` adds `o_bias` on the output projection too);
    `qk_norm` is Qwen3's RMSNorm on each head of q and k. A mixture of experts of the Qwen3-MoE
    kind has `num_experts` SwiGLU experts of width `moe_intermediate_size` and a router in
    every layer's MLP, `num_experts_per_tok` of them computing each token. A vision-language
    model's vision tower has `vision_parameters` (`vision_tower_parameters`), beside the
    decoder layers like the embeddings (FSDP2 shards it with the root).
    """

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None = None
    head_dim: int | None = None
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    mlp_bias: bool = False
    model_type: str = "llama"
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    vision_parameters: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def mlp_width(self) -> int:
        """The MLP width one token computes: the intermediate size, or its experts' together."""
        if self.is_moe:
            return self.num_experts_per_tok * self.moe_intermediate_size
        return self.intermediate_size

    @property
    def expert_parameters(self) -> int:
        """Parameters of one layer's experts (0 for a dense model)."""
        return self.num_experts * 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def active_parameters(self) -> int:
        """The parameters one token computes with: of a mixture of experts only the experts its
        router picks (as `parameters` for a dense model)."""
        idle = self.num_experts - self.num_experts_per_tok
        return self.parameters - self.num_hidden_layers * idle * self.expert_parameters // max(
            self.num_experts, 1)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_width(self) -> int:
        """Width of the query projection: heads × head_dim (not always hidden_size)."""
        return self.num_attention_heads * self.head_size

    @property
    def kv_width(self) -> int:
        """Width of the key (and of the value) projection: kv heads × head_dim."""
        return self.num_key_value_heads * self.head_size

    @property
    def layer_parameters(self) -> int:
        """Parameters of one decoder layer: q/k/v/o, gate/up/down, two RMSNorms (+ biases)."""
        h, q, kv, inter = self.hidden_size, self.q_width, self.kv_width, self.intermediate_size
        attention = h * (q + 2 * kv) + q * h
        attention += (q + 2 * kv) if self.qkv_bias else 0
        attention += h if self.o_bias else 0
        attention += 2 * self.head_size if self.qk_norm else 0
        mlp = 3 * h * inter + ((2 * inter + h) if self.mlp_bias else 0)
        if self.is_moe:  # the experts and the router
            mlp = self.expert_parameters + self.num_experts * h
        return attention + mlp + 2 * h

    @property
    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def root_parameters(self) -> int:
        """Parameters outside the decoder layers: embeddings, final norm, output head (and a
        vision-language model's vision tower)."""
        head = 0 if self.tie_word_embeddings else self.embedding_parameters
        return self.embedding_parameters + self.hidden_size + head + self.vision_parameters

    @property
    def parameters(self) -> int:
        """Distinct parameters of the causal LM (tied embeddings counted once)."""
        return self.num_hidden_layers * self.layer_parameters + self.root_parameters

    @property
    def critic_parameters(self) -> int:
        """The value model: the same body without the output head, with a (hidden → 1) score
        layer and its bias (a token classifier with one label)."""
        return self.num_hidden_layers * self.layer_parameters + self.critic_root_parameters

    @property
    def critic_root_parameters(self) -> int:
        return self.embedding_parameters + self.hidden_size + self.hidden_size + 1

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """KV-cache bytes of one token: keys and values of every layer."""
        return 2 * self.num_hidden_layers * self.kv_width * dtype_bytes


def _qwen2(h, inter, layers, heads, kv, vocab, tied, positions) -> ModelShape:
    return ModelShape(h, inter, layers, heads, kv, vocab, tied, positions, qkv_bias=True,
                      model_type="qwen2")


def _qwen3(h, inter, layers, heads, kv, tied) -> ModelShape:
    return ModelShape(h, inter, layers, heads, kv, 151936, tied, 40960, head_dim=128,
                      qk_norm=True, model_type="qwen3")


def _qwen3_moe(h, inter, layers, heads, kv, experts, top_k, width) -> ModelShape:
    return ModelShape(h, inter, layers, heads, kv, 151936, False, 40960, head_dim=128,
                      qk_norm=True, model_type="qwen3_moe", num_experts=experts,
                      num_experts_per_tok=top_k, moe_intermediate_size=width)


def vision_tower_parameters(vision: Mapping[str, Any], out_hidden_size: int = 0) -> int:
    """Parameters of a Qwen2.5-VL vision tower of config `vision` (its `vision_config`): the
    patch embedding (a 3-D convolution without bias), `depth` blocks (two RMSNorms, the qkv and
    output projections with biases, a gated MLP with biases) and the merger (an RMSNorm and two
    linear layers over each merged block of patches, out to the text model's width)."""
    h, inter = int(vision["hidden_size"]), int(vision["intermediate_size"])
    merged = h * int(vision.get("spatial_merge_size") or 2) ** 2
    out = int(vision.get("out_hidden_size") or out_hidden_size)
    channels = int(vision.get("in_channels") or vision.get("in_chans") or 3)
    pixels = (channels * int(vision.get("temporal_patch_size") or 2)
              * int(vision.get("patch_size") or 14) ** 2)
    block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (3 * h * inter + 2 * inter + h)
    merger = h + merged * merged + merged + merged * out + out
    return pixels * h + int(vision["depth"]) * block + merger


def _qwen2_5_vl(h, inter, layers, heads, kv, vocab, tied) -> ModelShape:
    """A Qwen2.5-VL: a Qwen2.5 text model under the vision tower all its sizes share."""
    tower = {"hidden_size": 1280, "intermediate_size": 3420, "depth": 32}
    return ModelShape(h, inter, layers, heads, kv, vocab, tied, 128000, qkv_bias=True,
                      model_type="qwen2_5_vl",
                      vision_parameters=vision_tower_parameters(tower, out_hidden_size=h))


def _llama(h, inter, layers, heads, kv, tied, head_dim=None) -> ModelShape:
    return ModelShape(h, inter, layers, heads, kv, 128256, tied, 131072, head_dim=head_dim)


# The config.json values of common models, for when their folder cannot be read here (the web
# process plans a submission for a cluster's file system). From the models' config.json on the
# Hugging Face hub (hidden, intermediate, layers, heads, kv heads, vocabulary, tied, positions);
# published sizes in the comments. Instruct variants share their base model's shape.
_BASE_SHAPES: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-0.5B": _qwen2(896, 4864, 24, 14, 2, 151936, True, 32768),  # 0.49B
    "Qwen/Qwen2.5-1.5B": _qwen2(1536, 8960, 28, 12, 2, 151936, True, 32768),  # 1.54B
    "Qwen/Qwen2.5-3B": _qwen2(2048, 11008, 36, 16, 2, 151936, True, 32768),  # 3.09B
    "Qwen/Qwen2.5-7B": _qwen2(3584, 18944, 28, 28, 4, 152064, False, 32768),  # 7.61B
    "Qwen/Qwen2.5-14B": _qwen2(5120, 13824, 48, 40, 8, 152064, False, 32768),  # 14.7B
    "Qwen/Qwen2.5-32B": _qwen2(5120, 27648, 64, 40, 8, 152064, False, 32768),  # 32.5B
    "Qwen/Qwen2.5-72B": _qwen2(8192, 29568, 80, 64, 8, 152064, False, 32768),  # 72.7B
    "Qwen/Qwen3-0.6B": _qwen3(1024, 3072, 28, 16, 8, True),  # 0.6B
    "Qwen/Qwen3-1.7B": _qwen3(2048, 6144, 28, 16, 8, True),  # 1.7B
    "Qwen/Qwen3-4B": _qwen3(2560, 9728, 36, 32, 8, True),  # 4.0B
    "Qwen/Qwen3-8B": _qwen3(4096, 12288, 36, 32, 8, False),  # 8.2B
    "Qwen/Qwen3-14B": _qwen3(5120, 17408, 40, 40, 8, False),  # 14.8B
    "Qwen/Qwen3-32B": _qwen3(5120, 25600, 64, 64, 8, False),  # 32.8B
    "Qwen/Qwen3-30B-A3B": _qwen3_moe(2048, 6144, 48, 32, 4, 128, 8, 768),  # 30.5B, 3.3B active
    "Qwen/Qwen3-235B-A22B": _qwen3_moe(4096, 12288, 94, 64, 4, 128, 8, 1536),  # 235B, 22B active
    "Qwen/Qwen2.5-VL-3B": _qwen2_5_vl(2048, 11008, 36, 16, 2, 151936, True),  # 3.75B
    "Qwen/Qwen2.5-VL-7B": _qwen2_5_vl(3584, 18944, 28, 28, 4, 152064, False),  # 8.29B
    "Qwen/Qwen2.5-VL-32B": _qwen2_5_vl(5120, 27648, 64, 40, 8, 152064, False),  # 33.5B
    "Qwen/Qwen2.5-VL-72B": _qwen2_5_vl(8192, 29568, 80, 64, 8, 152064, False),  # 73.4B
    "meta-llama/Llama-3.1-8B": _llama(4096, 14336, 32, 32, 8, False),  # 8.03B
    "meta-llama/Llama-3.1-70B": _llama(8192, 28672, 80, 64, 8, False),  # 70.6B
    "meta-llama/Llama-3.2-1B": _llama(2048, 8192, 16, 32, 8, True, head_dim=64),  # 1.24B
    "meta-llama/Llama-3.2-3B": _llama(3072, 8192, 28, 24, 8, True, head_dim=128),  # 3.21B
}


def _with_variants(shapes: Mapping[str, ModelShape]) -> dict[str, ModelShape]:
    """Base names plus their -Instruct (and Qwen3 -Base, Meta-Llama-) spellings."""
    out: dict[str, ModelShape] = {}
    for name, shape in shapes.items():
        org, model = name.split("/")
        out[name] = out[f"{org}/{model}-Instruct"] = shape
        if model.startswith("Qwen3-"):
            out[f"{org}/{model}-Base"] = shape
        if model.startswith("Llama-3.1-"):
            out[f"{org}/Meta-{model}"] = out[f"{org}/Meta-{model}-Instruct"] = shape
    return out


KNOWN_SHAPES: dict[str, ModelShape] = _with_variants(_BASE_SHAPES)


def known_shape(name: str) -> ModelShape | None:
    """The shape of a known model by its hub name or its folder's last part, any case."""
    wanted = name.rstrip("/").lower()
    last = wanted.rsplit("/", 1)[-1]
    for key, shape in KNOWN_SHAPES.items():
        if key.lower() == wanted or key.lower().rsplit("/", 1)[-1] == last:
            return shape
    return None


def shape_from_config(config: Mapping[str, Any], source: str = "config.json") -> ModelShape:
    """The shape in a Hugging Face config.json mapping (a multimodal model's `text_config`).

    An InputError naming `source` when a size is missing, or the model is a mixture of experts
    of another kind than Qwen3-MoE's (shared experts, dense layers between sparse ones).
    """
    outer_type = config.get("model_type")  # a vision-language model's, not its text model's
    vision = config.get("vision_config") if outer_type == "qwen2_5_vl" else None
    if "hidden_size" not in config and isinstance(config.get("text_config"), Mapping):
        config = config["text_config"]
    experts = int(config.get("num_experts") or config.get("num_local_experts")
                  or config.get("n_routed_experts") or 0)
    shared = any(config.get(k) for k in ("n_shared_experts", "shared_expert_intermediate_size",
                                         "first_k_dense_replace", "mlp_only_layers"))
    if experts and (shared or int(config.get("decoder_sparse_step") or 1) != 1
                    or not config.get("moe_intermediate_size")):
        raise InputError(f"{source}: a mixture of experts ({experts} experts) with shared "
                         "experts or dense layers, which the memory plan does not cover; it "
                         "plans dense models and Qwen3-MoE-style ones (every layer's MLP "
                         "routed experts only)")
    missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads", "vocab_size") if not config.get(k)]
    if missing:
        raise InputError(f"{source}: no {', '.join(missing)}: not a Llama/Qwen-style decoder "
                         "config; point model.path at a causal LM folder")
    model_type = str(outer_type or config.get("model_type") or "llama")
    attention_bias = bool(config.get("attention_bias", False))  # Llama: q, k, v and o
    return ModelShape(
        hidden_size=int(config["hidden_size"]),
        intermediate_size=int(config["intermediate_size"]),
        num_hidden_layers=int(config["num_hidden_layers"]),
        num_attention_heads=int(config["num_attention_heads"]),
        num_key_value_heads=int(config.get("num_key_value_heads")
                                or config["num_attention_heads"]),
        vocab_size=int(config["vocab_size"]),
        # Qwen2, Qwen3 and Llama configs default to untied embeddings
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        max_position_embeddings=config.get("max_position_embeddings"),
        head_dim=config.get("head_dim"),
        qkv_bias=model_type in ("qwen2", "qwen2_5_vl") or attention_bias,
        o_bias=attention_bias,
        qk_norm=model_type.startswith("qwen3"),
        mlp_bias=bool(config.get("mlp_bias", False)),
        model_type=model_type,
        num_experts=experts,
        num_experts_per_tok=int(config.get("num_experts_per_tok") or 0) if experts else 0,
        moe_intermediate_size=int(config.get("moe_intermediate_size") or 0) if experts else 0,
        vision_parameters=vision_tower_parameters(vision, int(config["hidden_size"]))
        if isinstance(vision, Mapping) else 0,
    )


def tiny_shape(size: str) -> ModelShape:
    """The shape of the built-in `tiny:<size>` model (ValueError for an unknown size)."""
    preset = get_size(size)
    base = WARM_BASES[size].size if size in WARM_BASES else size  # a warm start: its model's
    if base in TINY_VISION:  # its text model under its vision tower (rl_core.models.vision)
        vision = TINY_VISION[base]
        text = tiny_shape(vision.text)
        tower = {"hidden_size": vision.hidden_size, "intermediate_size": vision.intermediate_size,
                 "depth": vision.depth}
        return dataclasses.replace(
            text, vocab_size=TINY_VL_VOCAB_SIZE, model_type="qwen2_5_vl",
            vision_parameters=vision_tower_parameters(tower, text.hidden_size))
    if preset.is_moe:
        return ModelShape(preset.hidden_size, preset.intermediate_size, preset.num_hidden_layers,
                          preset.num_attention_heads, preset.num_key_value_heads,
                          TINY_VOCAB_SIZE, True, preset.max_position_embeddings, qk_norm=True,
                          model_type="qwen3_moe", num_experts=preset.num_experts,
                          num_experts_per_tok=preset.num_experts_per_tok,
                          moe_intermediate_size=preset.moe_intermediate_size)
    return ModelShape(preset.hidden_size, preset.intermediate_size, preset.num_hidden_layers,
                      preset.num_attention_heads, preset.num_key_value_heads, TINY_VOCAB_SIZE,
                      True, preset.max_position_embeddings, qkv_bias=True, model_type="qwen2")


def shape_of(spec: RunSpec) -> ModelShape:
    """The policy's shape: the tiny preset for `tiny:<size>`, config.json of `model.path` when
    it is readable here, else the built-in figures of a known model name; an InputError naming
    `model.path` otherwise."""
    path = spec.model.path
    if path.startswith(TINY_PREFIX):
        try:
            return tiny_shape(path[len(TINY_PREFIX):])
        except ValueError as exc:
            raise InputError(f"model.path: {exc}") from None
    config = Path(path).expanduser() / "config.json"
    if config.is_file():
        return shape_from_config(_read_json(config), f"model.path: {config}")
    shape = known_shape(path)
    if shape is None:
        raise InputError(
            f"model.path: cannot read {config} here and {Path(path).name!r} is not a known model; "
            "point model.path at a Hugging Face folder with config.json, or name one of: "
            + ", ".join(_BASE_SHAPES))
    return shape


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"model.path: cannot read {path}: {exc}") from None


# --------------------------------------------------------------------------- run setup


@dataclass(frozen=True)
class Setup:
    """What memory depends on in a spec, flattened so an alternative can change one thing.

    `devices` is the data-parallel size fsdp2 shards over (and Megatron's distributed optimizer
    with the context-parallel ranks). `*_rows` are responses per device in
    one forward: the actor's training micro-batch, its old log-prob pass, the reference's and
    the critic's (None: that stage does not run). `rollout_prompts` and `rollout_rows` are the
    prompts and response rows one device generates at once (training or validation batch).
    """

    dtype: str
    strategy: str
    devices: int
    gradient_checkpointing: bool
    offload_param: bool
    offload_optimizer: bool
    prompt_len: int
    response_len: int
    train_rows: int
    old_logprob_rows: int | None
    reference_rows: int | None
    reference_offload: bool
    critic_rows: int | None
    rollout_prompts: int
    rollout_rows: int
    entropy: bool
    cache_float32: bool
    device_type: str
    dynamic_bsz: bool
    attention: str = "sdpa"
    rollout_engine: str = "native"
    # `rollout.engine: auto`: vLLM where its share fits beside training, else the native engine
    engine_auto: bool = False
    gpu_memory_utilization: float = 0.5
    max_model_len: int = 0
    device_memory_bytes: int | None = None
    master_weights: bool = True  # actor.master_weights: float32 masters below float32
    # parallel.context_parallel_size: the devices sharing each row's tokens, and how
    context_parallel: int = 1
    context_parallel_algo: str = "ulysses"
    # parallel.tensor_parallel_size: the devices splitting each layer's matrices
    tensor_parallel: int = 1
    # parallel.expert_parallel_size: the devices splitting each layer's experts
    expert_parallel: int = 1
    # rollout.tensor_parallel_size: the devices of a rollout group, each its part of the layers
    rollout_parallel: int = 1
    # reward.reward_model: its shape and the rows of one of its forwards (None: no such model)
    reward_model: ModelShape | None = None
    reward_model_rows: int | None = None
    # parallel.rollout_devices: a rollout pool of its own (0: the rollout shares the devices)
    rollout_pool: int = 0
    # parallel.pipeline_parallel_size and virtual_pipeline_parallel_size (megatron): the stages
    # the layers are cut into, and the chunks of them each device holds
    pipeline_parallel: int = 1
    virtual_pipeline: int = 1
    # actor.recompute as megatron resolves it ("full", "selective", None: every layer kept)
    recompute: str | None = None
    # actor.lora: the adapters' rank (0: full fine-tuning) and target modules
    lora_rank: int = 0
    lora_targets: tuple[str, ...] | str = ()

    @property
    def ranks(self) -> int:
        """Devices: data- × context- × tensor- (× pipeline-) parallel (FSDP2 shards over the
        first two, each tensor-parallel part of the model: every device holds 1/ranks of it)."""
        return self.devices * self.context_parallel * self.tensor_parallel * self.pipeline_parallel

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len


def setup_of(spec: RunSpec) -> Setup:
    """The `Setup` of a resolved spec."""
    dp, n = spec.data_parallel_size, spec.rollout.n_samples_per_prompt
    cp, tp = spec.parallel.context_parallel_size, spec.parallel.tensor_parallel_size
    pp, rp = spec.parallel.pipeline_parallel_size, spec.rollout.tensor_parallel_size
    # every device rolls out, a rollout group together; or only a pool's devices
    pool = spec.parallel.rollout_devices
    groups = max(1, (pool or dp * cp * tp * pp) // rp)
    prompts = math.ceil(spec.data.train_batch_size / groups)
    # greedy validation, one response per prompt, when the run evaluates (the spec then has
    # validation prompts)
    val_rows = math.ceil(spec.data.val_batch_size / groups) if spec.trainer.eval_every else 0
    return Setup(
        dtype=spec.model.dtype, strategy=spec.actor.strategy, devices=dp,
        gradient_checkpointing=spec.model.gradient_checkpointing,
        offload_param=spec.actor.offload.param, offload_optimizer=spec.actor.offload.optimizer,
        prompt_len=spec.data.max_prompt_length, response_len=spec.rollout.max_new_tokens,
        **_micro_rows(spec, dp), reference_offload=spec.reference.offload,
        rollout_prompts=max(prompts, val_rows), rollout_rows=max(prompts * n, val_rows),
        entropy=spec.actor.entropy_coeff > 0,
        cache_float32=spec.resources.device_type == "cpu" or spec.model.dtype == "float32",
        device_type=spec.resources.device_type, dynamic_bsz=spec.actor.use_dynamic_bsz,
        rollout_engine=planned_engine(spec), engine_auto=spec.rollout.engine == "auto",
        gpu_memory_utilization=spec.rollout.gpu_memory_utilization,
        max_model_len=vllm_max_model_len(spec),
        master_weights=spec.actor.master_weights, context_parallel=cp,
        context_parallel_algo=spec.parallel.context_parallel_algo, tensor_parallel=tp,
        expert_parallel=spec.parallel.expert_parallel_size,
        rollout_parallel=rp, reward_model=reward_model_shape(spec),
        reward_model_rows=min(spec.reward.reward_model_micro_batch_size,
                              math.ceil(spec.data.train_batch_size / dp)
                              * spec.rollout.n_samples_per_prompt)
        if spec.reward.reward_model is not None else None,
        rollout_pool=pool, pipeline_parallel=pp,
        virtual_pipeline=spec.parallel.virtual_pipeline_parallel_size,
        recompute=megatron_recompute(spec),
        **_lora_setup(spec),
    )


def _lora_setup(spec: RunSpec) -> dict[str, Any]:
    lora = spec.actor.lora
    if lora is None:
        return {}
    targets = lora.target_modules
    return {"lora_rank": lora.rank,
            "lora_targets": targets if isinstance(targets, str) else tuple(targets)}


def lora_parameters(shape: ModelShape, rank: int, targets: tuple[str, ...] | str) -> int:
    """Parameters of LoRA adapters of `rank` on the `targets` linear layers of every decoder
    layer (A: rank × in, B: out × rank); `all-linear` is all seven projections. The experts of
    a mixture of experts are not linear layers: only its attention gets adapters."""
    h, q, kv, inter = shape.hidden_size, shape.q_width, shape.kv_width, shape.intermediate_size
    sizes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    if not shape.is_moe:
        sizes.update({"gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)})
    names = sizes if targets == "all-linear" else targets
    per_layer = sum(rank * sum(sizes[name]) for name in names if name in sizes)
    return shape.num_hidden_layers * per_layer


def megatron_recompute(spec: RunSpec) -> str | None:
    """`actor.recompute` under `actor.strategy: megatron`, null following
    `model.gradient_checkpointing` ("full" when it is on); None for the other engines."""
    if spec.actor.strategy != "megatron":
        return None
    return spec.actor.recompute or ("full" if spec.model.gradient_checkpointing else None)


def reward_model_shape(spec: RunSpec) -> ModelShape | None:
    """The shape of `reward.reward_model`: its config.json where readable here, else (a folder
    on the cluster) the policy's; None without one."""
    path = spec.reward.reward_model
    if path is None:
        return None
    config = Path(path).expanduser() / "config.json"
    if config.is_file():
        return shape_from_config(_read_json(config), f"reward.reward_model: {config}")
    return shape_of(spec)


def _micro_rows(spec: RunSpec, dp: int) -> dict[str, int | None]:
    """Rows per forward of each stage, as the roles split them; with `use_dynamic_bsz` the
    token budget (the actor's, which the reference and the critic share) holds
    `max_token_len_per_gpu // length` full-length rows."""
    actor, n = spec.actor, spec.rollout.n_samples_per_prompt
    seq = spec.data.max_prompt_length + spec.rollout.max_new_tokens
    rows = math.ceil(spec.data.train_batch_size / dp) * n  # responses per device per step
    mini = max(1, actor.ppo_mini_batch_size * n // dp)  # a rank's share of a mini-batch
    budget = max(1, actor.max_token_len_per_gpu // seq) if actor.use_dynamic_bsz else None
    train = budget or actor.ppo_micro_batch_size
    if spec.algorithm == "dpo":  # pairs kept whole
        train = max(2, actor.ppo_micro_batch_size // 2 * 2)
    # one pass over one mini-batch is on-policy: no old log-prob stage (as the RL recipe)
    on_policy = actor.ppo_epochs == 1 and actor.ppo_mini_batch_size >= spec.data.train_batch_size
    old = budget or spec.rollout.log_prob_micro_batch_size
    return {
        "train_rows": min(train, mini),
        "old_logprob_rows": None if on_policy or spec.algorithm == "dpo" else min(old, rows),
        "reference_rows": min(budget or spec.reference.log_prob_micro_batch_size, rows)
        if spec.reference.enable else None,
        "critic_rows": min(budget or spec.critic.ppo_micro_batch_size, mini)
        if spec.critic.enable else None,
    }


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Component:
    """One thing held in memory: its bytes per device and the phases it is on the device in
    (`PHASES`).

    `host`: it lives in host memory outside those phases (offloaded, or fsdp2's host copy).
    """

    name: str
    bytes: int
    phases: tuple[str, ...]
    note: str = ""
    host: bool = False
    device: str = "training"  # which devices hold it: "training", or "pool" (`DEVICES`)

    @property
    def role(self) -> str:
        """The role (process) that holds it: actor (a colocated rollout included), reference,
        critic, reward_model, or rollout (a pool of its own)."""
        if self.device == "pool":
            return "rollout"
        first = self.name.split(" ", 1)[0]
        return "actor" if first == "rollout" else first

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"phases": list(self.phases), "role": self.role}


@dataclass(frozen=True)
class Alternative:
    """A change of the spec and the peak it would give.

    `change`: the dotted overrides of this alternative and of those before it; `adds`: the
    overrides it adds to the one before.
    """

    change: str
    adds: str
    peak_bytes: int
    peak_phase: str
    fits: bool | None


@dataclass(frozen=True)
class MemoryPlan:
    """The memory of a run per device; `fits` is None when the device memory is unknown."""

    model: str
    parameters: int
    setup: Setup
    components: tuple[Component, ...]
    device_memory_bytes: int | None
    alternatives: tuple[Alternative, ...] = field(default=())
    active_parameters: int | None = None  # of a mixture of experts: those a token computes with

    def phase_bytes(self, role: str | None = None, device: str | None = None) -> dict[str, int]:
        """Device bytes of each phase: all roles on one device of `device` (by default the
        devices with the larger peak: with a rollout pool of its own the training devices and
        the pool's hold different things), or only `role`'s (what that role's process
        allocates, e.g. to compare with its `max_memory_allocated`)."""
        if role is None and device is None:
            device = self.peak_device
        return _phase_totals([c for c in self.components if (role is None or c.role == role)
                              and (device is None or c.device == device)])

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.role for c in self.components))

    @property
    def devices(self) -> tuple[str, ...]:
        """The kinds of device the plan covers: training, and pool with a pool of its own."""
        return tuple(d for d in DEVICES if any(c.device == d for c in self.components)) \
            or (DEVICES[0],)

    @property
    def device_peaks(self) -> dict[str, int]:
        """The peak bytes of one device of each kind."""
        return {d: max(_phase_totals([c for c in self.components if c.device == d]).values())
                for d in self.devices}

    @property
    def peak_device(self) -> str:
        """The kind of device whose peak is the plan's (training on a tie)."""
        peaks = self.device_peaks
        return max(peaks, key=lambda d: peaks[d])

    @property
    def peak_phase(self) -> str:
        totals = self.phase_bytes()
        return max(PHASES, key=lambda p: totals[p])

    @property
    def total_bytes(self) -> int:
        """The peak: device bytes of the largest phase."""
        return self.phase_bytes()[self.peak_phase]

    @property
    def host_bytes(self) -> int:
        """Bytes per device in host memory: the offloaded components and the host copy fsdp2
        shards from (an upper bound: that copy is freed when sharding ends)."""
        return sum(c.bytes for c in self.components if c.host)

    @property
    def usable_bytes(self) -> int | None:
        if self.device_memory_bytes is None:
            return None
        return int(self.device_memory_bytes * (1 - HEADROOM_FRACTION))

    @property
    def fits(self) -> bool | None:
        usable = self.usable_bytes
        return None if usable is None else self.total_bytes <= usable

    @property
    def message(self) -> str:
        return _message(self)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary (bytes as integers)."""
        return {
            "model": self.model, "parameters": self.parameters,
            "active_parameters": self.active_parameters or self.parameters,
            "strategy": self.setup.strategy, "devices": self.setup.devices,
            "dtype": self.setup.dtype, "setup": dataclasses.asdict(self.setup),
            "components": [c.to_dict() for c in self.components],
            "phases": self.phase_bytes(), "peak_phase": self.peak_phase,
            "peak_device": self.peak_device, "device_peaks": self.device_peaks,
            "roles": {role: self.phase_bytes(role) for role in self.roles},
            "total_bytes": self.total_bytes, "host_bytes": self.host_bytes,
            "device_memory_bytes": self.device_memory_bytes, "usable_bytes": self.usable_bytes,
            "fits": self.fits, "message": self.message,
            "alternatives": [dataclasses.asdict(a) for a in self.alternatives],
        }


def plan(spec: RunSpec, shape: ModelShape | None = None,
         device_memory_bytes: int | None = None) -> MemoryPlan:
    """The memory plan of `spec` (shape: `shape_of(spec)` when not given).

    `device_memory_bytes`: memory of one device; None takes the spec's device kind from
    `DEVICE_MEMORY_GB` (an NPU counts as a 910B; GPU and CPU: unknown, no verdict).
    When the plan does not fit, the alternatives are computed and the message names the first
    that fits.
    """
    shape = shape or shape_of(spec)
    if device_memory_bytes is None:
        device_memory_bytes = device_memory_of(spec.resources.device_type)
    setup = dataclasses.replace(setup_of(spec), device_memory_bytes=device_memory_bytes)
    return plan_setup(setup, shape, device_memory_bytes, spec.model.path)


def plan_setup(setup: Setup, shape: ModelShape, device_memory_bytes: int | None,
               model: str = "") -> MemoryPlan:
    """The plan of a `Setup` (what `plan` does after reading the spec). With `rollout.engine:
    auto` planned as vLLM, the native engine's plan when vLLM's share would not fit and the
    native engine's does (a run then takes the native engine: `rl_core.rollout.resolve_engine`)."""
    result = MemoryPlan(model, shape.parameters, setup, tuple(components(setup, shape)),
                        device_memory_bytes, active_parameters=shape.active_parameters)
    if result.fits is False and setup.engine_auto and setup.rollout_engine == "vllm":
        native = dataclasses.replace(setup, rollout_engine="native")
        fallback = plan_setup(native, shape, device_memory_bytes, model)
        if fallback.fits:
            return fallback
    if result.fits is False:
        result = dataclasses.replace(result, alternatives=tuple(
            _alternatives(setup, shape, device_memory_bytes)))
    return result


def components(s: Setup, shape: ModelShape) -> list[Component]:
    """Every component of the run, role by role (a pool's on its own devices)."""
    rollout = _pool(s, shape) if s.rollout_pool else _rollout(s, shape)
    parts = _actor_state(s, shape) + rollout + _actor_passes(s, shape)
    parts += _reference(s, shape)
    if s.critic_rows is not None:
        parts += _critic(s, shape)
    if s.reward_model is not None and s.reward_model_rows is not None:
        parts += _reward_model(s, s.reward_model, s.reward_model_rows)
    return [c for c in parts if c.bytes > 0]


# --------------------------------------------------------------------------- training state


def _train_state(role: str, params: int, root: int, layer: int, s: Setup,
                 offload_param: bool = False, offload_optimizer: bool = False,
                 trained: int | None = None, trained_layer: int | None = None
                 ) -> list[Component]:
    """Parameters, gradients, AdamW moments and the engine's own buffers of a trained model
    (`trained`: of the `params` those that train, LoRA's adapters, `trained_layer` a layer's
    of them; None: all)."""
    if s.strategy == "fsdp2":
        return _fsdp2_state(role, params, root, layer, s, offload_param, offload_optimizer,
                            trained, trained_layer)
    return _torch_state(role, params, s, offload_optimizer, trained)


def _torch_state(role: str, params: int, s: Setup, offload_optimizer: bool,
                 trained: int | None = None) -> list[Component]:
    b, dtype = s.dtype_bytes, s.dtype
    moments = (TRAINED, False) if not offload_optimizer else (("step",), True)
    masters = s.master_weights and dtype != "float32"
    g, state = (4, "float32") if masters else (b, dtype)  # what AdamW steps, and its grads
    lora = trained is not None
    trained = params if trained is None else trained
    of = " (the LoRA adapters')" if lora else ""
    parts = [Component(f"{role} parameters", params * b, PHASES,
                       f"{dtype}, a full copy per device"
                       + (", the frozen base and its adapters" if lora else ""))]
    if masters:
        parts.append(Component(f"{role} master weights", trained * 4, PHASES,
                               f"float32 copies AdamW steps{of}; the parameters are set from "
                               "them"))
    parts += [
        Component(f"{role} gradients", trained * g, ("backward", "step"), state + of),
        Component(f"{role} AdamW moments", 2 * trained * g, moments[0],
                  f"exp_avg, exp_avg_sq in {state}"
                  + ("" if masters or dtype == "float32" else " (no float32 master copy)"),
                  moments[1]),
    ]
    if s.ranks > 1:
        parts.append(Component(f"{role} gradient all-reduce", trained * g, ("step",),
                               "the flattened gradients summed over the ranks"))
    return parts


def _fsdp2_state(role: str, params: int, root: int, layer: int, s: Setup, offload_param: bool,
                 offload_optimizer: bool, trained: int | None = None,
                 trained_layer: int | None = None) -> list[Component]:
    b, shard = s.dtype_bytes, math.ceil(params / s.ranks) * 4
    # LoRA: gradients and moments of the adapters only (`trained_layer` a layer's), none of
    # the root's
    lora = trained is not None
    grads = math.ceil(trained / s.ranks) * 4 if lora else shard
    of = " (the LoRA adapters')" if lora else ""
    where = ((), True) if offload_param else (PHASES, False)  # made at load
    moments = (((), True) if offload_param else (TRAINED, False) if not offload_optimizer
               else (("step",), True))  # made by the first step
    over = f"float32, 1/{s.ranks} per device"
    t = s.tensor_parallel  # a device gathers its tensor-parallel part of a unit only
    root, layer = math.ceil(root / t), math.ceil(layer / t)
    part = f" (1/{t}: tensor parallel)" if t > 1 else ""
    return [
        Component(f"{role} host copy before sharding", params * (b + 4 if b < 4 else 4), (),
                  f"on the host during load: loaded in {s.dtype}, cast to float32", True),
        Component(f"{role} unit being sharded", max(root, layer) * 4, ("load",),
                  f"the largest unit (a layer or the root){part} in float32, moved to be "
                  "sharded"),
        Component(f"{role} parameter shards", shard, where[0], f"master weights, {over}",
                  where[1]),
        Component(f"{role} gradient shards", grads, ("backward", "step") if not offload_param
                  else (), over + of, offload_param),
        Component(f"{role} AdamW moments", 2 * grads, moments[0],
                  f"exp_avg, exp_avg_sq, {over}{of}", moments[1]),
        Component(f"{role} AdamW step temporary", 0 if offload_param else grads, ("step",),
                  "one moment-sized buffer of the foreach step"),
        Component(f"{role} gathered layers", (root + 2 * layer) * b, ("backward",),
                  f"root + the running and the next layer{part}, {s.dtype}"),
        Component(f"{role} unsharded gradients",
                  (math.ceil((trained_layer or 0) / t) * (b + 4)) if lora
                  else (root + layer) * b + layer * 4, ("backward",),
                  f"one layer's adapters'{part}, reduced in float32" if lora
                  else f"the root's and one layer's{part}, reduced in float32"),
        Component(f"{role} root gradient reduce", 0 if lora else root * (b + 4), ("step",),
                  "the root's gradients, upcast to float32 at the end of backward"),
    ]


def _actor_state(s: Setup, shape: ModelShape) -> list[Component]:
    if s.strategy == "megatron":
        return _megatron_state("actor", s, shape, offload_optimizer=s.offload_optimizer)
    adapters = lora_parameters(shape, s.lora_rank, s.lora_targets) if s.lora_rank else None
    params = shape.parameters + (adapters or 0)
    layer = _layer_unit(s, shape)
    if adapters:
        layer += adapters // shape.num_hidden_layers
    return _train_state("actor", params, shape.root_parameters, layer, s, s.offload_param,
                        s.offload_optimizer, trained=adapters,
                        trained_layer=adapters // shape.num_hidden_layers if adapters else None)


# --------------------------------------------------------------------------- megatron


def megatron_stage_parameters(shape: ModelShape, pipeline: int,
                              critic: bool = False) -> tuple[int, int, str]:
    """The parameters of the pipeline stage with the most of them, before tensor and expert
    parallelism: its dense parameters, its experts' and which stage it is ("first", "last", or
    "only" without a pipeline). Every stage holds L/p decoder layers (with interleaving, v
    chunks of L/(p·v)); the first also the embedding (and a vision tower), the last the final
    norm and the output head: with tied embeddings and p > 1 a copy of the embedding as its
    output layer; a critic's last stage the final norm and its score layer (hidden -> 1, bias)."""
    layers = math.ceil(shape.num_hidden_layers / pipeline)
    experts = layers * shape.expert_parameters
    body = layers * (shape.layer_parameters - shape.expert_parameters)
    first = shape.embedding_parameters + (0 if critic else shape.vision_parameters)
    if critic:
        last = 2 * shape.hidden_size + 1
    else:
        copy = pipeline > 1 or not shape.tie_word_embeddings
        last = shape.hidden_size + (shape.embedding_parameters if copy else 0)
    if pipeline == 1:
        return body + first + last, experts, "only"
    if first > last:
        return body + first, experts, "first"
    return body + last, experts, "last"


def _megatron_part(s: Setup, dense: int, experts: int) -> int:
    """A device's parameters of a stage: its dense part 1/t, its experts 1/(t·e)."""
    t = s.tensor_parallel
    return math.ceil(dense / t) + math.ceil(experts / (t * s.expert_parallel))


def _megatron_where(s: Setup, stage: str) -> str:
    """Which part of the model a device holds, for the notes."""
    parts = [] if stage == "only" else [f"the {stage} of {s.pipeline_parallel} stages"]
    if s.tensor_parallel > 1:
        parts.append(f"1/{s.tensor_parallel} (tensor parallel)")
    if s.expert_parallel > 1:
        parts.append(f"experts 1/{s.tensor_parallel * s.expert_parallel}")
    return ", ".join(parts) or "the whole model"


def largest_tensor(shape: ModelShape) -> int:
    """Elements of the model's largest tensor as Megatron holds it whole: the embedding (or
    output head), the fused q/k/v projection, the fused gate/up projection (a dense MLP's or
    one expert's) or a router."""
    h = shape.hidden_size
    mlp = 2 * h * (shape.moe_intermediate_size if shape.is_moe else shape.intermediate_size)
    return max(shape.embedding_parameters, h * (shape.q_width + 2 * shape.kv_width), mlp,
               shape.num_experts * h)


def _megatron_load_tensor(role: str, s: Setup, shape: ModelShape) -> Component:
    return Component(f"{role} load tensor", largest_tensor(shape) * s.dtype_bytes, ("load",),
                     f"the largest tensor in {s.dtype}, read whole from the folder and "
                     "scattered over the tensor-parallel ranks")


def _megatron_state(role: str, s: Setup, shape: ModelShape, critic: bool = False,
                    offload_optimizer: bool = False) -> list[Component]:
    """Megatron's training state on a device: its stage's weights in model.dtype, the float32
    gradient buffer as large, the distributed optimizer's shard (float32 main parameters below
    float32, two float32 moments) over D·c ranks for dense weights and D·c/e for experts; the
    load's largest tensor, and for the actor the weight sync's one full tensor."""
    b = s.dtype_bytes
    dense, experts, stage = megatron_stage_parameters(shape, s.pipeline_parallel, critic)
    t, e = s.tensor_parallel, s.expert_parallel
    own_dense, own_experts = math.ceil(dense / t), math.ceil(experts / (t * e))
    params = own_dense + own_experts
    ranks = s.devices * s.context_parallel  # Megatron's data-parallel group with context
    expert_ranks = max(1, ranks // e)  # its expert-data-parallel group
    shard = math.ceil(own_dense / ranks) + math.ceil(own_experts / expert_ranks)
    over = f"1/{ranks} per device" + (f", experts 1/{expert_ranks}" if experts else "")
    moments = (("step",), True) if offload_optimizer else (TRAINED, False)
    masters = (("step",), True) if offload_optimizer else (PHASES, False)
    where = ", in host memory outside the step" if offload_optimizer else ""
    parts = [
        Component(f"{role} parameters", params * b, PHASES,
                  f"{s.dtype} (Float16Module), {_megatron_where(s, stage)}"),
        Component(f"{role} gradient buffer", params * 4, PHASES,
                  "float32 (grad_reduce_in_fp32), allocated with the model and kept"),
        Component(f"{role} main parameter shard", shard * 4 if b < 4 else 0, masters[0],
                  f"the distributed optimizer's float32 copies, {over}{where}", masters[1]),
        Component(f"{role} Adam moments", 2 * shard * 4, moments[0],
                  f"exp_avg, exp_avg_sq in float32, {over}{where}", moments[1]),
        Component(f"{role} Adam step temporary", shard * 4, ("step",),
                  "one moment-sized buffer of the step"),
        _megatron_load_tensor(role, s, shape),
    ]
    if role == "actor":
        parts.append(Component("actor weight sync tensor", largest_tensor(shape) * b,
                               ("rollout",), f"one full tensor at a time in {s.dtype}, gathered "
                               "over the tensor-, expert- and pipeline-parallel ranks"))
    return parts


def megatron_activation_bytes_per_token(shape: ModelShape, dtype_bytes: int,
                                        recompute: str | None, tensor_parallel: int = 1,
                                        pipeline: int = 1, virtual: int = 1, seq_len: int = 0,
                                        attention: str = "sdpa") -> int:
    """Activation bytes per token of a micro-batch on the first pipeline stage, which holds
    `pipeline` micro-batches in flight through its L/p layers (L layers' worth; interleaved
    over `virtual` chunks, (1 + (p - 1)/(p·v)) times that), each layer split `tensor_parallel`
    ways as `activation_bytes_per_token` splits it. `recompute`: "full" keeps each layer's
    input and recomputes one layer at a time; "selective" drops what the attention core keeps
    (its output, and eager attention's s² term); None keeps every layer's activations."""
    b, h, t = dtype_bytes, shape.hidden_size, tensor_parallel
    raw = _layer_activation_bytes(shape, b, seq_len, attention)
    layer = _split(raw, b * h, t)
    if recompute == "full":
        kept, recomputed = math.ceil(b * h / t), layer
    elif recompute == "selective":
        core = b * shape.q_width + (raw - _layer_activation_bytes(shape, b, seq_len, "sdpa"))
        kept, recomputed = _split(raw - core, b * h, t), 0
    else:
        kept, recomputed = layer, 0
    in_flight = shape.num_hidden_layers * kept  # p micro-batches x L/p layers
    if virtual > 1:  # interleaved: (1 + (p - 1)/(p·v)) times as much
        stages = pipeline * virtual
        in_flight = -(-in_flight * (stages + pipeline - 1) // stages)
    return in_flight + recomputed + _top_activation_bytes(shape, b, t)


def _megatron_how(s: Setup, recompute: str | None) -> str:
    """How a megatron micro-batch's activations are kept, for the notes."""
    how = {"full": "full recompute", "selective": "selective recompute"}.get(
        recompute or "", "all layers kept")
    p, v = s.pipeline_parallel, s.virtual_pipeline
    if p > 1:
        how += f", {p} micro-batches in flight" + (f", {v} chunks interleaved" if v > 1 else "")
    return how


# --------------------------------------------------------------------------- rollout


def _rollout(s: Setup, shape: ModelShape) -> list[Component]:
    """The native rollout: full weights (fsdp2), the fast decoder's rearranged weights, the
    static KV cache and its compaction copy, the prefill and the sampling logits."""
    if s.rollout_engine == "vllm":
        return _vllm_rollout(s, shape)
    b, h, inter, r = s.dtype_bytes, shape.hidden_size, shape.mlp_width, s.rollout_parallel
    fused = shape.q_width + 2 * shape.kv_width + 2 * inter  # q/k/v and gate/up outputs
    cache = _kv_cache_bytes(s, shape)
    rows, kept = s.rollout_rows, s.rollout_rows - s.rollout_rows // 4
    prefill = s.rollout_prompts * s.prompt_len * (math.ceil((fused + inter) / r) + 2 * h) * b
    layers = shape.num_hidden_layers * shape.layer_parameters
    own = shape.parameters - layers + math.ceil(layers / r)  # layers split, the rest whole
    full = own * b if s.strategy in ("fsdp2", "megatron") or s.lora_rank else 0
    part = f"; its part of the layers (1/{r}: a rollout group)" if r > 1 else ""
    parks = s.device_type != "cpu"  # in host memory from the log-probs to the next sync
    source = ("tensor by tensor" if s.strategy == "megatron" else "from the shards"
              if s.strategy == "fsdp2" else "from the training model")
    source += ", the LoRA adapters merged" if s.lora_rank else ""
    return [
        Component("rollout full weights", full, ("load", "rollout") if parks else PHASES,
                  f"the rollout's own model in {s.dtype}, synced {source}{part}"
                  + ("; parked in host memory while training computes" if parks else "")),
        Component("rollout weights parked", full if parks else 0, (),
                  "the rollout's own model in host memory while training computes", True),
        _packed_weights(s, shape, fused),
        Component("rollout float32 head", shape.vocab_size * h * 4, ("rollout",),
                  "the output head with the final norm folded in"),
        Component("rollout KV cache", cache, ("rollout",),
                  f"{rows} rows x {_kv_length(s)} tokens"),
        Component("rollout KV compaction copy", cache * kept // max(rows, 1), ("rollout",),
                  f"the {kept} running rows copied when a quarter has stopped"),
        Component("rollout prefill", prefill, ("rollout",),
                  f"{s.rollout_prompts} prompts x {s.prompt_len} tokens, one layer"),
        Component("rollout sampling logits", rows * shape.vocab_size * 16, ("rollout",),
                  "float32 logits, probabilities and the top-p/top-k sort"),
    ]


def _pool(s: Setup, shape: ModelShape) -> list[Component]:
    """A rollout pool of its own (`parallel.rollout_devices`): on each pool device the policy's
    copy, which the weights received replace (the native engine generates from it; vLLM keeps
    its own, counted with it, and the copy waits in host memory), and the rollout's memory; the
    training devices hold no rollout."""
    parts = [c for c in _rollout(s, shape) if c.name not in ("rollout full weights",
                                                             "rollout weights parked")]
    if s.rollout_engine == "native":
        parts.insert(0, Component("rollout weights", shape.parameters * s.dtype_bytes, PHASES,
                                  f"the pool's copy of the policy in {s.dtype}"))
    return [dataclasses.replace(c, name=c.name.replace("rollout", "pool", 1), device="pool")
            for c in parts]


def _vllm_rollout(s: Setup, shape: ModelShape) -> list[Component]:
    """vLLM's own copy of the weights and its KV cache. On an accelerator it takes
    `gpu_memory_utilization` of the device while generating and sleeps in every other phase
    (weights in host memory, cache dropped); on the CPU it does not sleep, keeps every
    projection prepacked beside the embedding, and sizes its cache for `VLLM_CPU_MAX_SEQS` sequences
    of `max_model_len` tokens (`VLLM_CPU_MAX_SEQS`). In a tensor-parallel group of r devices
    each holds 1/r of the weights (the vocabulary split too) and of the key/value heads."""
    b, r = s.dtype_bytes, s.rollout_parallel
    weights = shape.parameters * b
    template = [Component("actor full model (template)", weights, (), "the model the shards "
                          "and the saved folders are made from, in host memory", host=True)
                ] if s.strategy == "fsdp2" else []
    part = f"; 1/{r} (a vLLM tensor-parallel group)" if r > 1 else ""
    weights = math.ceil(weights / r)
    per_token = math.ceil(shape.kv_bytes_per_token(b) / r)
    if s.device_type != "cpu":
        if s.device_memory_bytes is None:
            cache = s.rollout_rows * _kv_length(s) * per_token
            note = "one batch's sequences (device memory unknown)"
        else:
            cache = int(s.gpu_memory_utilization * s.device_memory_bytes) - weights
            note = (f"the rest of rollout.gpu_memory_utilization {s.gpu_memory_utilization} of "
                    "the device; dropped while asleep")
        return template + [
            Component("vLLM weights", weights, ("rollout",),
                      f"synced after every update; in host memory while vLLM sleeps{part}",
                      host=True),
            Component("vLLM KV cache", max(cache, 0), ("rollout",), note + part)]
    cache = vllm_cpu_kv_tokens(s.max_model_len, VLLM_CPU_MAX_SEQS) * per_token
    packed = math.ceil((shape.parameters - shape.embedding_parameters) * b / r)
    return template + [
        Component("vLLM weights", weights, PHASES,
                  f"vLLM's own copy, synced after every update{part}"),
        Component("vLLM packed projections", packed, PHASES, f"oneDNN prepacked copies{part}"),
        Component("vLLM KV cache", cache, PHASES,
                  f"{VLLM_CPU_MAX_SEQS} sequences x {s.max_model_len} tokens, allocated at "
                  f"start{part}"),
    ]


def _packed_weights(s: Setup, shape: ModelShape, fused: int) -> Component:
    """The fast decoder's copies of the layers' weights: q/k/v and gate/up concatenated with
    the norms folded in (and their biases); on CPU oneDNN's prepacked copies of the output and
    down projections too (on other devices those are the model's own tensors)."""
    b, h, layers = s.dtype_bytes, shape.hidden_size, shape.num_hidden_layers
    if shape.is_moe:  # generated by transformers' own forward, over the model's weights
        return Component("rollout packed weights", 0, ("rollout",),
                         "none: a mixture of experts generates through the model's own forward")
    packed = layers * (h + 1) * fused * b
    note = "q/k/v and gate/up concatenated with the norms folded in"
    if s.device_type == "cpu":
        packed += layers * h * (shape.q_width + shape.intermediate_size) * b
        note += "; on CPU every projection prepacked for oneDNN"
    if s.rollout_parallel > 1:
        packed = math.ceil(packed / s.rollout_parallel)
        note += f"; 1/{s.rollout_parallel} (a rollout group)"
    return Component("rollout packed weights", packed, ("rollout",), note)


def _kv_length(s: Setup) -> int:
    return -(-s.seq_len // KV_LENGTH_ROUND) * KV_LENGTH_ROUND


def _kv_cache_bytes(s: Setup, shape: ModelShape) -> int:
    """Keys and values of every layer: rows x length x 2 x layers x kv heads x head_dim."""
    cache_bytes = 4 if s.cache_float32 else s.dtype_bytes
    per_token = math.ceil(shape.kv_bytes_per_token(cache_bytes) / s.rollout_parallel)
    return s.rollout_rows * _kv_length(s) * per_token  # a rollout group: its kv heads


# --------------------------------------------------------------------------- forward passes


def activation_bytes_per_token(shape: ModelShape, dtype_bytes: int, checkpointing: bool,
                               seq_len: int = 0, attention: str = "sdpa",
                               tensor_parallel: int = 1) -> int:
    """Activation bytes one token of a training micro-batch keeps for backward (all layers;
    the formula is in the module docstring). `seq_len` matters for `eager` attention only.
    With `tensor_parallel` t every term is split t ways, but for the gathered inputs of
    attention and the MLP (2·b·h a layer) and of the output head (b·h)."""
    b, h, t = dtype_bytes, shape.hidden_size, tensor_parallel
    layer = _split(_layer_activation_bytes(shape, b, seq_len, attention), b * h, t)
    layers = shape.num_hidden_layers
    kept = layers * math.ceil(b * h / t) + layer if checkpointing else layers * layer
    return kept + _top_activation_bytes(shape, b, t)


def _layer_activation_bytes(shape: ModelShape, b: int, seq_len: int, attention: str) -> int:
    """What one decoder layer keeps per token for backward (the module docstring's formula)."""
    h, inter = shape.hidden_size, shape.mlp_width
    layer = 2 * (4 + b) * h + 5 * b * shape.q_width + 4 * b * inter
    if shape.is_moe:  # each token's copies to and from its experts, the router's float32 output
        layer += 2 * b * shape.num_experts_per_tok * h + 3 * 4 * shape.num_experts
    if shape.qk_norm:
        layer += (4 + b) * (shape.q_width + shape.kv_width)
    if attention == "eager":
        layer += shape.num_attention_heads * seq_len * (4 + b)
    return layer


def _split(layer: int, bh: int, t: int) -> int:
    """A layer's activations over `t` tensor-parallel devices: split, but for the gathered
    inputs of attention and the MLP (2·b·h), kept whole."""
    return math.ceil(layer / t) + (2 * bh if t > 1 else 0)


def _top_activation_bytes(shape: ModelShape, b: int, t: int) -> int:
    """Beyond the layers: the final norm and the output head's input, and the gradients in
    flight through the layer being back-propagated (the head's input whole under t > 1)."""
    h, inter = shape.hidden_size, shape.mlp_width
    top = (4 + 2 * b) * h + b * (2 * h + 2 * inter)
    return math.ceil(top / t) + b * h if t > 1 else top


def forward_bytes_per_token(shape: ModelShape, dtype_bytes: int, tensor_parallel: int = 1) -> int:
    """Working bytes per token of a forward without gradients: one layer's intermediates (the
    projections' outputs split `tensor_parallel` ways, their gathered input whole)."""
    h, inter = shape.hidden_size, shape.mlp_width
    fused = shape.q_width + 2 * shape.kv_width + 2 * inter
    return dtype_bytes * (math.ceil((fused + inter) / tensor_parallel) + 2 * h) + 4 * h


def logits_bytes(rows: int, response_len: int, vocab: int, dtype_bytes: int, training: bool) -> int:
    """Logits of a micro-batch in the model's dtype (in training their gradient too) and one
    chunk's float32 working buffers (two per position, at most LOGPROB_CHUNK_BYTES)."""
    elements = rows * response_len * vocab
    chunk = min(2 * 4 * elements, LOGPROB_CHUNK_BYTES)
    return elements * dtype_bytes * (2 if training else 1) + chunk


def _actor_passes(s: Setup, shape: ModelShape) -> list[Component]:
    """The actor's training micro-batch and its old log-prob forward."""
    b, seq, vocab = s.dtype_bytes, s.seq_len, _vocab_part(s, shape)
    if s.strategy == "megatron":
        per_token = megatron_activation_bytes_per_token(
            shape, b, s.recompute, s.tensor_parallel, s.pipeline_parallel, s.virtual_pipeline,
            seq, s.attention)
        how = _megatron_how(s, s.recompute)
    else:
        per_token = activation_bytes_per_token(shape, b, s.gradient_checkpointing, seq,
                                               s.attention, s.tensor_parallel)
        how = "checkpointed" if s.gradient_checkpointing else "all layers kept"
    cp, shared = s.context_parallel, _shared(s)
    parts = [
        Component("actor activations", math.ceil(s.train_rows * seq / cp) * per_token,
                  ("backward",), f"{s.train_rows} rows x {seq} tokens{shared}, {how}"),
        Component("actor logits",
                  math.ceil(logits_bytes(s.train_rows, s.response_len, vocab, b, True) / cp),
                  ("backward",),
                  f"{s.train_rows} rows x {s.response_len} x {vocab}{shared}"),
    ]
    if cp > 1 and s.context_parallel_algo == "ring":
        parts.append(_ring_weights("actor", s.train_rows, s, shape))  # beside the activations
    if s.old_logprob_rows is not None:
        parts += _forward("actor old log-probs", s.old_logprob_rows, s, shape, vocab)
        if s.strategy == "fsdp2":
            parts.append(Component("actor gathered layers (log-probs)",
                                   _gathered_layers(s, shape) * b, ("log-probs",),
                                   "root + two layers"))
    return parts


def _forward(name: str, rows: int, s: Setup, shape: ModelShape, vocab: int) -> list[Component]:
    """A forward without gradients over `rows` sequences: working set and logits."""
    cp, b = s.context_parallel, s.dtype_bytes
    tokens = math.ceil(rows * s.seq_len / cp)
    logits = (logits_bytes(rows, s.response_len, vocab, b, False) if vocab > 1
              else rows * s.response_len * 4)
    return [
        Component(f"{name} forward", tokens * forward_bytes_per_token(shape, b, s.tensor_parallel),
                  ("log-probs",),
                  f"{rows} rows x {s.seq_len} tokens{_shared(s)}, one layer at a time"),
        Component(f"{name} logits", math.ceil(logits / cp), ("log-probs",)),
    ]


def _ring_weights(role: str, rows: int, s: Setup, shape: ModelShape) -> Component:
    """What ring attention keeps for its backward, which recomputes each step's scores: every
    step's key/value block (in model.dtype), output (float32) and log-sum-exp, in every layer
    (the device holding the last tokens computes all `context_parallel` steps), and one step's
    float32 scores and weights while it recomputes them (two n x n per head)."""
    local = math.ceil(rows * s.seq_len / s.context_parallel)
    heads, dim = shape.num_attention_heads, shape.head_size
    kept = shape.num_hidden_layers * s.context_parallel * heads * local * (
        dim * (2 * s.dtype_bytes + 4) + 4)
    recomputed = 2 * 4 * heads * local * local
    return Component(f"{role} ring attention blocks", kept + recomputed, ("backward",),
                     f"{s.context_parallel} blocks of {local} tokens a layer, scores recomputed")


def _vocab_part(s: Setup, shape: ModelShape) -> int:
    """The output head's columns one device computes: its part of the vocabulary."""
    return math.ceil(shape.vocab_size / s.tensor_parallel)


def _gathered_layers(s: Setup, shape: ModelShape) -> int:
    """Parameters FSDP2 gathers on a device to compute: the root and two layers (their
    tensor-parallel part; with expert parallelism, the device's share of their experts)."""
    return math.ceil((shape.root_parameters + 2 * _layer_unit(s, shape)) / s.tensor_parallel)


def _layer_unit(s: Setup, shape: ModelShape) -> int:
    """The parameters of a layer a device gathers in full: all but, with expert parallelism,
    the experts other devices of its block hold."""
    others = s.expert_parallel - 1
    return shape.layer_parameters - shape.expert_parameters * others // s.expert_parallel


def _shared(s: Setup) -> str:
    """How a context-parallel group shares a micro-batch's tokens, for the notes."""
    return f" / {s.context_parallel} devices" if s.context_parallel > 1 else ""


# --------------------------------------------------------------------------- other roles


def _reference(s: Setup, shape: ModelShape) -> list[Component]:
    if s.reference_rows is None:
        return []
    if s.lora_rank:  # the actor's base with its adapters off: its forward only, in the actor
        return _forward("actor reference log-probs", s.reference_rows, s, shape,
                        _vocab_part(s, shape))
    forward = _forward("reference", s.reference_rows, s, shape, _vocab_part(s, shape))
    offload = s.reference_offload and s.device_type != "cpu"
    if s.strategy == "megatron":  # its stage's weights, frozen: no gradients, no optimizer
        dense, experts, stage = megatron_stage_parameters(shape, s.pipeline_parallel)
        params = _megatron_part(s, dense, experts)
        return [
            Component("reference parameters", params * s.dtype_bytes,
                      ("log-probs",) if offload else PHASES,
                      f"{s.dtype}, {_megatron_where(s, stage)}"
                      + (", in host memory outside its stage" if offload else ""), offload),
            _megatron_load_tensor("reference", s, shape),
            *forward]
    if s.strategy == "fsdp2":  # sharded in model.dtype, without gradients or optimizer state
        b = s.dtype_bytes
        return [
            Component("reference host copy before sharding", shape.parameters * b, (),
                      f"loaded on the host in {s.dtype}, sharded in place", True),
            Component("reference parameter shards", math.ceil(shape.parameters / s.ranks) * b,
                      () if offload else PHASES,
                      f"{s.dtype}, 1/{s.ranks} per device"
                      + (", in host memory" if offload else ""), offload),
            Component("reference gathered layers", _gathered_layers(s, shape) * b,
                      ("log-probs",),
                      f"root + the running and the next layer, {s.dtype}"),
            *forward]
    phases = ("log-probs",) if offload else PHASES
    where = "host memory outside its stage" if offload else "on the device"
    params = Component("reference parameters", shape.parameters * s.dtype_bytes, phases,
                       f"{s.dtype}, {where}", offload)
    return [params, *forward]


def _reward_model(s: Setup, shape: ModelShape, rows: int) -> list[Component]:
    """The reward model: frozen and whole on every device, one forward of `rows` rows in the
    stages (its score head reads one position a row: no logits to speak of)."""
    b, tokens = s.dtype_bytes, rows * s.seq_len
    return [
        Component("reward_model parameters", shape.parameters * b, PHASES,
                  f"{s.dtype}, whole on every device"),
        Component("reward_model forward", tokens * forward_bytes_per_token(shape, b),
                  ("log-probs",), f"{rows} rows x {s.seq_len} tokens, one layer at a time"),
    ]


def _critic(s: Setup, shape: ModelShape) -> list[Component]:
    """The critic: its own training state, an update without checkpointing, a values forward."""
    rows, seq = s.critic_rows or 0, s.seq_len
    how = "all layers kept"
    if s.strategy == "megatron":
        per_token = megatron_activation_bytes_per_token(
            shape, s.dtype_bytes, None, s.tensor_parallel, s.pipeline_parallel,
            s.virtual_pipeline, seq, s.attention)
        state = _megatron_state("critic", s, shape, critic=True)
        how = _megatron_how(s, None)
    else:
        per_token = activation_bytes_per_token(shape, s.dtype_bytes, False, seq, s.attention,
                                               s.tensor_parallel)
        state = _train_state("critic", shape.critic_parameters, shape.critic_root_parameters,
                             _layer_unit(s, shape), s)
    update = Component("critic activations", math.ceil(rows * seq / s.context_parallel) * per_token,
                       ("backward",), f"{rows} rows x {seq} tokens{_shared(s)}, {how}")
    ring = ([_ring_weights("critic", rows, s, shape)]
            if s.context_parallel > 1 and s.context_parallel_algo == "ring" else [])
    return [*state, update, *ring, *_forward("critic values", rows, s, shape, 1)]


# --------------------------------------------------------------------------- alternatives


def _alternatives(s: Setup, shape: ModelShape, memory: int | None) -> list[Alternative]:
    """Cumulative changes, cheapest first: fsdp2 at this device count, a smaller vLLM share,
    gradient checkpointing, micro-batches of one sequence, offload; each with its peak."""
    steps, changes, current = [], [], s
    for change, updated in _changes(s):
        current, changes = dataclasses.replace(current, **updated), [*changes, change]
        peak = MemoryPlan("", 0, current, tuple(components(current, shape)), memory)
        steps.append(Alternative(" ".join(changes), change, peak.total_bytes, peak.peak_phase,
                                 peak.fits))
    return steps


def _changes(s: Setup) -> Iterable[tuple[str, dict[str, Any]]]:
    sharded = s.strategy == "fsdp2" or s.devices > 1  # fsdp2 comes first when it can
    if s.strategy == "torch" and s.devices > 1:
        yield "actor.strategy=fsdp2", {"strategy": "fsdp2"}
    if s.rollout_engine == "vllm" and s.device_type != "cpu" and s.gpu_memory_utilization > 0.3:
        # vLLM's share is the rollout phase's largest part: a smaller KV cache is cheap
        yield "rollout.gpu_memory_utilization=0.3", {"gpu_memory_utilization": 0.3}
    if s.strategy == "megatron":
        if s.recompute != "full":
            yield "actor.recompute=full", {"recompute": "full"}
    elif not s.gradient_checkpointing:
        yield "model.gradient_checkpointing=true", {"gradient_checkpointing": True}
    smaller = _one_row_micro_batches(s)
    if smaller:
        yield smaller
    texts, fields = [], {}
    if sharded and not s.offload_param and s.strategy != "megatron":  # fsdp2's only
        texts.append("actor.offload.param=true")
        fields["offload_param"] = True
    if not s.offload_optimizer:
        texts.append("actor.offload.optimizer=true")
        fields["offload_optimizer"] = True
    if s.reference_rows is not None and not s.reference_offload:
        texts.append("reference.offload=true")
        fields["reference_offload"] = True
    if fields:
        yield " ".join(texts), fields


def _one_row_micro_batches(s: Setup) -> tuple[str, dict[str, Any]] | None:
    """Every micro-batch one sequence: the overrides and the Setup fields."""
    texts, fields = [], {}
    if s.train_rows > 1:
        texts.append(f"actor.max_token_len_per_gpu={s.seq_len}" if s.dynamic_bsz
                     else "actor.ppo_micro_batch_size=1")
        fields["train_rows"] = 1
    for name, key, rows in (("rollout", "old_logprob_rows", s.old_logprob_rows),
                            ("reference", "reference_rows", s.reference_rows),
                            ("critic", "critic_rows", s.critic_rows),
                            ("reward", "reward_model_rows", s.reward_model_rows)):
        if rows is not None and rows > 1:
            fields[key] = 1
            if not (name == "rollout" and s.dynamic_bsz):
                texts.append(f"{name}.{_MICRO_KEYS[name]}=1")
    return (" ".join(texts), fields) if fields else None


_MICRO_KEYS = {"rollout": "log_prob_micro_batch_size", "reference": "log_prob_micro_batch_size",
               "critic": "ppo_micro_batch_size", "reward": "reward_model_micro_batch_size"}


# --------------------------------------------------------------------------- text


def gib(n: int | float) -> str:
    """Bytes as GiB with one decimal ("41.2")."""
    return f"{n / GIB:.1f}"


def _unit(p: MemoryPlan) -> tuple[str, int]:
    """GiB, or MiB for a plan whose peak is under one GiB (the tiny models)."""
    return ("GiB", GIB) if p.total_bytes >= GIB else ("MiB", 2**20)


def _size(n: int | None, unit: tuple[str, int]) -> str:
    return f"{(n or 0) / unit[1]:.1f}"


def _noun(s: Setup) -> str:
    return DEVICE_NOUN.get(s.device_type, "device")


def _message(p: MemoryPlan) -> str:
    unit = _unit(p)
    noun, peak = _noun(p.setup), f"{_size(p.total_bytes, unit)} {unit[0]} in {p.peak_phase}"
    if len(p.devices) > 1:  # a rollout pool of its own: the devices whose peak it is
        noun = f"{p.peak_device} {noun}"
    if p.device_memory_bytes is None:
        return f"needs {peak} per {noun}; device memory unknown (give --device-memory-gb N)"
    of = (f"{_size(p.usable_bytes, unit)} usable of {_size(p.device_memory_bytes, unit)} "
          f"{unit[0]} per {noun}")
    if p.fits:
        return f"fits: {peak}, {of}"
    first = next((a for a in p.alternatives if a.fits), None)
    if first is not None:
        return (f"does not fit: {peak}, {of}; with {first.change} it needs "
                f"{_size(first.peak_bytes, unit)} {unit[0]} in {first.peak_phase}")
    if p.alternatives:
        last = p.alternatives[-1]
        return (f"does not fit: {peak}, {of}; even with {last.change} it needs "
                f"{_size(last.peak_bytes, unit)} {unit[0]} in {last.peak_phase}: use more or "
                "larger devices")
    return f"does not fit: {peak}, {of}: use more or larger devices"


def format_table(p: MemoryPlan) -> str:
    """The plan as a fixed-width table (per device, one column per phase) and the verdict."""
    s, unit = p.setup, _unit(p)
    active = (f" ({_count(p.active_parameters)} active)"
              if p.active_parameters and p.active_parameters != p.parameters else "")
    lines = [f"memory plan of {p.model or 'the run'}: {_count(p.parameters)} parameters{active}, "
             f"{s.dtype}, actor.strategy={s.strategy} over {s.ranks} {_noun(s)}(s)"
             + (f", {s.context_parallel} to a sequence" if s.context_parallel > 1 else "")
             + (f", {s.tensor_parallel} to a layer" if s.tensor_parallel > 1 else "")
             + (f", {s.pipeline_parallel} pipeline stages" if s.pipeline_parallel > 1 else "")
             + (f" of {s.virtual_pipeline} chunks a device" if s.virtual_pipeline > 1 else "")
             + (f", experts split {s.expert_parallel} ways" if s.expert_parallel > 1 else ""),
             _row(f"{unit[0]} per device", [*PHASES, "host"])]
    for device in p.devices:  # with a rollout pool of its own: its devices' after the others'
        for c in (c for c in p.components if c.device == device):
            cells = [_size(c.bytes, unit) if phase in c.phases else "" for phase in PHASES]
            lines.append(_row(c.name, [*cells, _size(c.bytes, unit) if c.host else ""]))
        totals = p.phase_bytes(device=device)
        host = sum(c.bytes for c in p.components if c.host and c.device == device)
        lines.append(_row("total" if len(p.devices) == 1 else f"total, a {device} device",
                          [*(_size(totals[q], unit) for q in PHASES), _size(host, unit)]))
    if p.alternatives:
        lines.append("alternatives, each adding to the one before:")
        lines += [f"  + {a.adds}: {_size(a.peak_bytes, unit)} {unit[0]} in {a.peak_phase}"
                  for a in p.alternatives]
    lines.append(p.message)
    return "\n".join(lines)


def _phase_totals(parts: Iterable[Component]) -> dict[str, int]:
    parts = list(parts)
    return {p: sum(c.bytes for c in parts if p in c.phases) for p in PHASES}


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _row(name: str, cells: list[str]) -> str:
    return (f"{name:<36}" + "".join(f"{cell:>10}" for cell in cells)).rstrip()


# --------------------------------------------------------------------------- devices


def device_memory_of(device: str) -> int | None:
    """Bytes of one device of a model in `DEVICE_MEMORY_GB` ("ascend-910b", "910B", "H100") or
    of a kind ("npu": a 910B); None when unknown or a CPU."""
    key = device.strip().lower()
    key = DEFAULT_DEVICE_MODEL.get(key, key) or ""
    for name, size in DEVICE_MEMORY_GB.items():
        if key in (name, name.split("-", 1)[-1]):
            return None if size is None else int(size * GIB)
    return None
