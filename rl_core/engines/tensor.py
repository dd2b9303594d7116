"""Tensor parallelism: each decoder layer's matrices split over the ranks of a tensor-parallel
group, so a model too large for one device's share trains; with FSDP2 over the other ranks.

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("shard", "tp"))
    engine = FSDP2Engine(model, mesh=mesh, ...)    # TP over "tp", FSDP2 over "shard"
    # or alone: parallelize(model, mesh["tp"])       # in place, DTensor plans per module

`parallelize` applies PyTorch's DTensor styles (`parallelize_module`) to the decoder families
rl_core loads (Qwen2/2.5/3, Llama 3: `model.model.layers`, Hugging Face names), in the layout of
Megatron-LM's sequence parallelism:

- between the layers the hidden states are split along the sequence (`Shard(1)`): each rank
  holds 1/size of the tokens, and the norms (`SequenceParallel`, weights replicated, their
  gradients summed over the group by DTensor) compute on their share;
- attention and the MLP gather the tokens (one all-gather) and split the work by columns: q, k,
  v and gate, up are column-parallel (each rank its heads and its part of the intermediate
  size), o and down row-parallel with a reduce-scatter back to sequence shares. Qwen3's per-head
  q/k norms run on the rank's heads with their weights replicated;
- the embedding is vocabulary-parallel (each rank its rows of the table; the partial sums
  reduce-scattered to sequence shares), and so is the LM head: each rank computes the logits of
  its part of the vocabulary only, and `vocab_parallel_logprobs` takes log-softmax, the label's
  log-prob and the entropy across the parts with two all-reduces of a few numbers a position:
  the full logits never exist on one rank. The final norm's output is gathered for the heads
  (they pick the positions they need: `logits_to_keep`). A value model's one-output head is
  replicated and computes every position's value on every rank.

Tied input and output embeddings stay tied (one vocabulary-sharded table). Attention heads,
key/value heads and the MLP's intermediate size must divide by the group's size
(`check_tensor_parallel`); the vocabulary need not (the last rank's part is shorter).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from rl_core.algos.entropy import (LOGPROB_CHUNK_BYTES, logprob_grad_chunk, position_blocks,
                                   scaled_logits)
from rl_core.collectives import all_reduce
from rl_core.engines.base import decoder_layers
from rl_core.errors import InputError

TP_DIM = "tp"  # the mesh dimension of tensor parallelism
SHARD_DIM = "shard"  # the mesh dimension FSDP2 shards over beside it
FIELD = "parallel.tensor_parallel_size"


def check_tensor_parallel(config: Any, size: int, field: str = FIELD) -> None:
    """An InputError naming `field` when `size` ranks cannot split the model's attention heads,
    key/value heads or MLP width evenly."""
    if size <= 1:
        return
    sizes = {"attention heads": getattr(config, "num_attention_heads", None),
             "key/value heads": getattr(config, "num_key_value_heads", None),
             "MLP intermediate size": getattr(config, "intermediate_size", None)}
    for what, count in sizes.items():
        if count is not None and count % size:
            raise InputError(f"{field}: {size} does not divide the model's {count} {what} "
                             f"(each rank computes an equal share of them): pick a divisor of "
                             f"{count}")


def tensor_plan(model: torch.nn.Module) -> dict[str, Any]:
    """The `parallelize_module` plan of a Hugging Face decoder (causal LM or token classifier):
    module name -> ParallelStyle (see the module docstring)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                                   RowwiseParallel, SequenceParallel)

    to_tokens = {"output_layouts": Shard(1), "use_local_output": False}
    plan: dict[str, Any] = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), **to_tokens),
        "model.norm": SequenceParallel(),
    }
    for i, layer in enumerate(decoder_layers(model)):
        at = f"model.layers.{i}"
        names = dict(layer.named_modules())
        missing = [n for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                               "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                               "mlp.down_proj", "input_layernorm", "post_attention_layernorm")
                   if n not in names]
        if missing:
            raise InputError(f"{FIELD}: {type(model).__name__}'s decoder layers lack "
                             f"{', '.join(missing)}; tensor parallelism knows the Qwen2/2.5/3 "
                             "and Llama layouts: set it to 1")
        plan |= {
            f"{at}.input_layernorm": SequenceParallel(),
            f"{at}.post_attention_layernorm": SequenceParallel(),
            f"{at}.self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()}, use_local_output=True),
            f"{at}.self_attn.q_proj": ColwiseParallel(),
            f"{at}.self_attn.k_proj": ColwiseParallel(),
            f"{at}.self_attn.v_proj": ColwiseParallel(),
            f"{at}.self_attn.o_proj": RowwiseParallel(**to_tokens),
            f"{at}.mlp": PrepareModuleInput(input_layouts=(Shard(1),),
                                            desired_input_layouts=(Replicate(),),
                                            use_local_output=True),
            f"{at}.mlp.gate_proj": ColwiseParallel(),
            f"{at}.mlp.up_proj": ColwiseParallel(),
            f"{at}.mlp.down_proj": RowwiseParallel(**to_tokens),
        }
        for norm in ("self_attn.q_norm", "self_attn.k_norm"):  # Qwen3: per head, on its heads
            if norm in names:
                plan[f"{at}.{norm}"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    if isinstance(getattr(model, "lm_head", None), torch.nn.Linear):
        plan["lm_head"] = ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(-1),
                                          use_local_output=False)
    elif not isinstance(getattr(model, "score", None), torch.nn.Linear):  # nor a value model
        raise InputError(f"{FIELD}: {type(model).__name__} has neither an lm_head nor a score "
                         "head: set it to 1")
    return plan


def parallelize(model: torch.nn.Module, mesh: Any,
                each: Callable[[torch.nn.Module], None] | None = None) -> torch.nn.Module:
    """Split `model` over the one-dimensional device mesh `mesh` (in place; see the module),
    decoder layer after decoder layer, then the rest. `each(unit)` is called on every layer
    as soon as it is split, then on the whole model: FSDP2 shards each there, so a model given
    on the host reaches the device one split layer at a time."""
    from torch.distributed.tensor import distribute_module
    from torch.distributed.tensor.parallel import parallelize_module

    check_tensor_parallel(model.config, mesh.size())
    tied = (getattr(model.config, "tie_word_embeddings", False)
            and getattr(model, "lm_head", None) is not None
            and model.lm_head.weight is model.model.embed_tokens.weight)
    plan = tensor_plan(model)
    for i, layer in enumerate(decoder_layers(model)):
        at = f"model.layers.{i}."
        parallelize_module(model, mesh, {k: v for k, v in plan.items() if k.startswith(at)})
        if each is not None:
            each(layer)
    parallelize_module(model, mesh, {k: v for k, v in plan.items()
                                     if not k.startswith("model.layers.")})
    if tied:  # both sharded by vocabulary rows alike: one table again
        model.lm_head.weight = model.model.embed_tokens.weight
    # the heads pick the positions they need from every token's final hidden state: gathered
    model.model.norm.register_forward_hook(_all_tokens)
    if getattr(model, "lm_head", None) is None:  # a value model's one output: on every rank
        distribute_module(model.score, mesh, input_fn=_replicated, output_fn=_local)
    if each is not None:
        each(model)
    return model


def _all_tokens(module: torch.nn.Module, inputs: Any, output: Any) -> torch.Tensor:
    """The final norm's output, split by tokens, in full on every rank (an all-gather; its
    backward keeps each rank's share of the gradient)."""
    from torch.distributed.tensor import Replicate

    return output.redistribute(placements=[Replicate()]).to_local()


def _replicated(module: torch.nn.Module, inputs: tuple, mesh: Any) -> tuple:
    from torch.distributed.tensor import DTensor, Replicate

    return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                 if isinstance(x, torch.Tensor) else x for x in inputs)


def _local(module: torch.nn.Module, output: Any, mesh: Any) -> Any:
    return output.to_local()


def is_vocab_parallel(logits: Any) -> bool:
    """Whether `logits` are a DTensor split by vocabulary (a tensor-parallel LM head's)."""
    from torch.distributed.tensor import DTensor

    return isinstance(logits, DTensor) and logits.placements[0].is_shard(logits.ndim - 1)


def vocab_parallel_logprobs(logits: Any, labels: torch.Tensor, temperature: float = 1.0,
                            with_entropy: bool = False, chunk_bytes: int = LOGPROB_CHUNK_BYTES
                            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`chunked_logprobs` of logits split by vocabulary over a tensor-parallel group (a DTensor
    (B, T, V) sharded on its last dimension): log softmax(logits / temperature)[label] and the
    entropy, (B, T) float32 on every rank, from each rank's part alone plus two all-reduces of
    (B, T) numbers (the maximum, then the exponentials' sum, the label's logit and Σ e·z). The
    backward needs no communication: each rank writes the gradient of its own part."""
    mesh = logits.device_mesh
    local = logits.to_local()
    vocab, size, rank = logits.shape[-1], mesh.size(), mesh.get_local_rank()
    start = min(rank * -(-vocab // size), vocab)  # DTensor's split: ceil(V / size) a rank
    return _VocabParallel.apply(local, labels, start, mesh.get_group(), temperature,
                                with_entropy, chunk_bytes)


def split_vocab_logprobs(local: torch.Tensor, labels: torch.Tensor, start: int, vocab: int,
                         group: Any, temperature: float = 1.0, with_entropy: bool = False,
                         chunk_bytes: int = LOGPROB_CHUNK_BYTES
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`vocab_parallel_logprobs` of plain tensors, as a vocabulary-parallel output layer of
    Megatron-Core gives them: this rank's logits (B, T, P) of the tokens [start, start + P)
    of a vocabulary padded past its `vocab` real tokens (the padding's logits, on the last
    ranks, are left out of the softmax and get no gradient), over the ranks of `group`."""
    real = max(0, min(local.shape[-1], vocab - start))
    if real < local.shape[-1]:
        local = local[..., :real]
    return _VocabParallel.apply(local, labels, start, group, temperature, with_entropy,
                                chunk_bytes)


class _VocabParallel(torch.autograd.Function):
    """The autograd function of `vocab_parallel_logprobs` (local logits, labels, the part's
    first vocabulary index, the group, then as `chunked_logprobs`)."""

    @staticmethod
    def forward(ctx, logits, labels, start, group, temperature, with_entropy, chunk_bytes):
        batch, length, part = logits.shape
        dtype = torch.promote_types(logits.dtype, torch.float32)
        rows = max(1, chunk_bytes // (2 * max(part, 1) * dtype.itemsize))
        local_labels = labels - start
        hit = (local_labels >= 0) & (local_labels < part)  # the label is in this part
        local_labels = local_labels.clamp(0, max(part - 1, 0))
        maxes = logits.new_full((batch, length), float("-inf"), dtype=dtype)
        for r, c in position_blocks(batch, length, rows):
            if part:
                maxes[r, c] = scaled_logits(logits[r, c], temperature, dtype).amax(-1).view(
                    maxes[r, c].shape)
        maxes = all_reduce(maxes, group, op=dist.ReduceOp.MAX)
        sums = logits.new_zeros((3, batch, length), dtype=dtype)  # Σ e, z_label, Σ e·z
        for r, c in position_blocks(batch, length, rows):
            if not part:
                continue
            shape = maxes[r, c].shape
            z = scaled_logits(logits[r, c], temperature, dtype).sub_(maxes[r, c].reshape(-1, 1))
            picked = z.gather(-1, local_labels[r, c].reshape(-1, 1)).view(shape)
            sums[1, r, c] = torch.where(hit[r, c], picked, 0.0)
            e = z.exp()
            sums[0, r, c] = e.sum(-1).view(shape)
            if with_entropy:
                sums[2, r, c] = e.mul_(z).sum(-1).view(shape)
        sums = all_reduce(sums, group)
        logsums = sums[0].log()
        logprobs = sums[1] - logsums
        entropy = logsums - sums[2] / sums[0] if with_entropy else None
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, local_labels, hit, maxes, logsums, entropy)
        ctx.temperature, ctx.rows = temperature, rows
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        """Each rank's part of `ChunkedLogProbs`' gradient: -p·(g_logp + g_H·(log p + H)), plus
        g_logp at the label where the label is in this part."""
        logits, labels, hit, maxes, logsums, entropy = ctx.saved_tensors
        none = (None,) * 6
        if grad_logprobs is None and grad_entropy is None:
            return None, *none
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        batch, length, part = logits.shape
        if not part:
            return grad, *none
        for r, c in position_blocks(batch, length, ctx.rows):
            per_position = [t[r, c].reshape(-1, 1) if t is not None else None
                            for t in (labels, maxes, logsums, entropy, grad_logprobs,
                                      grad_entropy)]
            logprob_grad_chunk(grad[r, c], logits[r, c], *per_position, ctx.temperature,
                            hit=hit[r, c].reshape(-1, 1))
        return grad, *none
