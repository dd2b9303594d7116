"""Context parallelism: a packed micro-batch's tokens split over the ranks of a context-parallel
group, so a sequence longer than one device's activation memory still trains.

    packed = pack(ids, mask, positions, response_len, multiple_of=size)   # N divisible by size
    local = packed.shard(rank, size)                  # tokens [rank·N/size, (rank+1)·N/size)
    with context_parallel(group, "ulysses"):          # the attention exchanges within `group`
        out = model(**local.model_inputs(), logits_to_keep=local.keep)
    logprobs = gather_shards(local_logprobs, local.counts, group)          # (K,), packed order

Every rank of the group holds the same rows and runs every layer on its share of the packed
tokens: embeddings, norms, projections, the MLP and the LM head are per token. Attention needs
the whole sequence, so around it (`ulysses_attention`, entered from packing's `sdpa_varlen`
while `context_parallel` is active) one all-to-all turns the query, key and value of
(local tokens, all heads) into (all tokens, heads / size), the variable-length attention runs on
the full packed sequence for those heads with its row boundaries, and a second all-to-all turns
the output back. Key/value heads fewer than (or not divisible by) the group are repeated to the
query heads first; query heads must divide by the size.

Ring attention (`ring_attention`, `context_parallel_algo: ring`) needs no head split: each rank
keeps its queries, and the keys and values travel around the group, one rank's block per step;
each step's attention (the packed rows' causal mask between the two token ranges) is merged
into the running output by its log-sum-exp (online softmax). Blocks wholly after a rank's
tokens are passed on without computing. The backward goes back through the same steps (the
ring pass's backward sends the key and value gradients the other way, one pass a step on every
rank, in the same order); each step's scores are recomputed there (activation checkpointing),
so a step keeps only its keys and values, output and log-sum-exp.

Each rank computes the log-probs (entropy, values) of the response tokens predicted from its
share; `gather_shards` puts the pieces together in packed order on every rank. Its backward
hands each rank the gradient of its own piece only, the all-to-alls' backward exchanges the
gradients of the keys and values, and the ranks' parameter gradients are partial sums: the
engine adds them up over the group (the plain engine by an all-reduce, FSDP2 by sharding over
the data- and context-parallel ranks together).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rl_core.collectives import all_gather, all_to_all, ring_pass
from rl_core.errors import InputError

ALGORITHMS = ("ulysses", "ring")
_GROUP: contextvars.ContextVar[tuple[Any, str] | None] = contextvars.ContextVar(
    "rl_core_context_group", default=None)


@contextlib.contextmanager
def context_parallel(group: Any, algorithm: str = "ulysses") -> Iterator[None]:
    """Within it, packed attention exchanges its tokens over `group` by `algorithm` (see the
    module)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown context-parallel algorithm {algorithm!r}; choose one of "
                         f"{', '.join(ALGORITHMS)}")
    token = _GROUP.set((group, algorithm))
    try:
        yield
    finally:
        _GROUP.reset(token)


def active_group() -> tuple[Any, str] | None:
    """The context-parallel group and algorithm of the forward now running, or None."""
    return _GROUP.get()


class _Exchange(torch.autograd.Function):
    """All-to-all that splits dimension `scatter` over the group and joins the pieces received
    along `gather`; its backward is the reverse exchange."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, scatter: int, gather: int) -> torch.Tensor:
        ctx.group, ctx.scatter, ctx.gather = group, scatter, gather
        return _exchange(x, group, scatter, gather)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _exchange(grad, ctx.group, ctx.gather, ctx.scatter), None, None, None


def _exchange(x: torch.Tensor, group: Any, scatter: int, gather: int) -> torch.Tensor:
    size = dist.get_world_size(group)
    received = all_to_all(torch.stack(x.chunk(size, scatter)), group)  # (size, ...)
    return torch.cat(received.unbind(0), gather)


class _KeyValueGroups:
    """A view of an attention module with another `num_key_value_groups` (the key and value
    heads repeated before the exchange); every other attribute is the module's."""

    def __init__(self, module: torch.nn.Module, groups: int) -> None:
        self._module, self.num_key_value_groups = module, groups

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def ulysses_attention(attend: Callable[..., tuple[torch.Tensor, Any]], module: torch.nn.Module,
                      query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, group: Any,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """`attend` (packed attention over the whole sequence) run on `group`'s shares of it.

    query (1, H, n, D), key and value (1, Hkv, n, D) for this rank's n = N / size tokens ->
    (1, n, H, D). `kwargs`: the whole sequence's row boundaries and the model's options."""
    size = dist.get_world_size(group)
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % size:
        raise ValueError(f"context parallelism (Ulysses) splits the attention heads over the "
                         f"group: {heads} heads do not divide by {size} ranks")
    if kv_heads % size:  # too few key/value heads to split: one per query head
        repeats = heads // kv_heads
        key, value = (x.repeat_interleave(repeats, 1) for x in (key, value))
        module = _KeyValueGroups(module, 1)  # type: ignore[assignment]
    query, key, value = (_Exchange.apply(x, group, 1, 2) for x in (query, key, value))
    out, _ = attend(module, query, key, value, None, **kwargs)  # (1, N, H / size, D)
    return _Exchange.apply(out, group, 1, 2), None


class _RingPass(torch.autograd.Function):
    """This rank's tensor to the next rank of the group, the previous rank's back; backward:
    the gradient the other way round."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return ring_pass(x, group, 1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return ring_pass(grad, ctx.group, -1), None


def ring_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, group: Any, bounds: Sequence[int],
                   scaling: float | None = None, **_: Any) -> tuple[torch.Tensor, None]:
    """Causal attention of a packed sequence whose N tokens are split over `group` (rank r
    holds tokens [r·n, (r+1)·n)), row boundaries `bounds` (b + 1 host ints over all N): the
    keys and values go round the ring, each block's attention merged by its log-sum-exp.

    query (1, H, n, D), key and value (1, Hkv, n, D) -> (1, n, H, D)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    n, heads = query.shape[2], query.shape[1]
    if key.shape[1] != heads:  # grouped-query attention: each query head its key/value head
        key, value = (x.repeat_interleave(heads // key.shape[1], 1) for x in (key, value))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    device = query.device
    lengths = torch.tensor([b - a for a, b in zip(bounds, bounds[1:])], device=device)
    row = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)  # (N,)
    mine = torch.arange(rank * n, (rank + 1) * n, device=device)
    out = lse = None
    pair = torch.stack([key, value])  # one pass a step: the backward goes back step by step
    for step in range(size):
        block = (rank - step) % size  # whose keys this rank holds now
        if step:
            pair = _RingPass.apply(pair, group)
        if block > rank:  # wholly after this rank's tokens: nothing to attend to, but its
            # pass must be in the graph (its backward is a collective every rank takes part in)
            assert out is not None
            out = out + pair.sum() * 0
            continue
        theirs = torch.arange(block * n, (block + 1) * n, device=device)
        allowed = (row[mine][:, None] == row[theirs][None, :]) & (theirs[None, :] <= mine[:, None])
        # recomputed in the backward: a step keeps its inputs and outputs, not its n x n scores
        block_out, block_lse = checkpoint(_block_attention, query, pair, allowed, scale,
                                          use_reentrant=False)
        if out is None or lse is None:  # the rank's own block first: every row sees itself
            out, lse = block_out, block_lse
            continue
        merged = torch.logaddexp(lse, block_lse)
        out = (out * (lse - merged).exp()[..., None]
               + block_out * (block_lse - merged).exp()[..., None])
        lse = merged
    assert out is not None
    return out.to(query.dtype).transpose(1, 2), None


def _block_attention(query: torch.Tensor, pair: torch.Tensor, allowed: torch.Tensor,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's attention: the output (1, H, n, D) in float32 and the log-sum-exp (1, H, n)
    of the queries against the block's keys and values (`pair`), where `allowed` (n, n)."""
    key, value = pair[0], pair[1]
    scores = (query @ key.transpose(-1, -2)) * scale  # (1, H, n, n)
    scores = scores.float().masked_fill(~allowed, float("-inf"))
    lse = scores.logsumexp(-1)  # -inf where a row sees none of the block
    finite = torch.where(torch.isinf(lse), 0.0, lse)
    weights = (scores - finite[..., None]).exp()  # 0 where masked
    return (weights.to(value.dtype) @ value).float(), lse


class _GatherShards(torch.autograd.Function):
    """The ranks' pieces (counts[r] values each) joined in rank order on every rank; backward:
    each rank's piece of the gradient (every rank computes the same loss from the whole)."""

    @staticmethod
    def forward(ctx: Any, piece: torch.Tensor, counts: Sequence[int], group: Any) -> torch.Tensor:
        rank = dist.get_rank(group)
        ctx.span = (sum(counts[:rank]), sum(counts[:rank + 1]))
        widest = max(counts)
        padded = F.pad(piece, (0, widest - piece.shape[0]))
        pieces = all_gather(padded, group)  # (size, widest)
        return torch.cat([pieces[r, :count] for r, count in enumerate(counts)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        start, stop = ctx.span
        return grad[start:stop], None, None


def gather_shards(piece: torch.Tensor, counts: Sequence[int], group: Any) -> torch.Tensor:
    """This rank's values (counts[rank],) and the others', joined: (sum(counts),)."""
    return _GatherShards.apply(piece, list(counts), group)


def context_groups(world_size: int, size: int, tensor: int = 1) -> tuple[Any, Any]:
    """This rank's data-parallel group (the ranks at its place in every block of size × `tensor`
    consecutive ranks: they hold different rows) and its context-parallel group (the `size`
    ranks of its block at its tensor-parallel index; None when `size` is 1). rank = (data index
    × size + context index) × tensor + tensor index. Every rank calls it (each group is made by
    all ranks, in the same order)."""
    block = size * tensor
    if world_size % block:
        raise ValueError(f"{world_size} ranks cannot form groups of {size} context × {tensor} "
                         "tensor-parallel ranks")
    rank = dist.get_rank()
    dp_group = cp_group = None
    if size > 1:
        for first in range(0, world_size, block):
            for t in range(tensor):
                members = list(range(first + t, first + block, tensor))
                group = dist.new_group(members)
                if rank in members:
                    cp_group = group
    for offset in range(block):
        members = list(range(offset, world_size, block))
        group = dist.new_group(members)
        if rank in members:
            dp_group = group
    return dp_group, cp_group


def check_heads(config: Any, size: int, algorithm: str = "ulysses",
                field: str = "parallel.context_parallel_size", tensor: int = 1) -> None:
    """An InputError naming `field` when `size` ranks cannot share the model's attention heads
    for Ulysses (query heads, those of one of `tensor` tensor-parallel ranks, must divide by
    it; key/value heads that do not are repeated); ring attention splits no heads."""
    heads = getattr(config, "num_attention_heads", None)
    if heads is not None and tensor > 1:
        heads //= tensor
    if algorithm == "ulysses" and size > 1 and heads is not None and heads % size:
        where = f" of a tensor-parallel rank (1/{tensor} of them)" if tensor > 1 else ""
        raise InputError(f"{field}: {size} does not divide the model's {heads} attention "
                         f"heads{where} (Ulysses gives each rank an equal share of them): pick "
                         f"a divisor of {heads}, or parallel.context_parallel_algo: ring")
