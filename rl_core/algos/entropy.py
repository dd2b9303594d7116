"""Token entropy and token log-probabilities from logits, computed stably via logsumexp."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.autograd.function import once_differentiable

# Working memory of one chunk of `chunked_logprobs`: its two (rows, V) buffers in the compute
# dtype. 256 MiB is 220 rows of a 151,936-token vocabulary in float32.
LOGPROB_CHUNK_BYTES = 256 * 2**20
_CHUNK_BUFFERS = 2


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) per position: (B, T, V) -> (B, T).

    H = -Σ p·log p with log p = z - logsumexp(z) from log_softmax, which shifts by the max: no
    log of an underflowed probability, and no cancellation between two large terms when all
    logits are large. Logits must be finite (mask entries with a large negative number, not -inf).
    """
    log_probs = torch.log_softmax(logits, dim=-1)  # (B, T, V)
    return -(log_probs.exp() * log_probs).sum(-1)


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] per position: logits (B, T, V), labels (B, T) -> (B, T)."""
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - torch.logsumexp(logits, dim=-1)


def chunked_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_bytes: int = LOGPROB_CHUNK_BYTES,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(logits / temperature)[label] and optionally the entropy, chunk by chunk.

    logits (B, T, V) in any floating dtype, labels (B, T) -> logprobs (B, T), entropy (B, T) |
    None, in float32 (float64 for float64 logits). The values of `log_softmax` and
    `entropy_from_logits` on `logits.float() / temperature` up to float32 rounding, without a
    float32 (B, T, V) tensor: the positions are taken a chunk at a time (`chunk_bytes` of working
    buffers), autograd keeps only the logits as they came (e.g. bfloat16) and three float32
    numbers per position (the maximum, the log-sum of the shifted exponentials, the entropy),
    and backward recomputes each chunk's softmax from them, writing the gradient in the logits'
    dtype. Logits must be finite where the entropy is asked for, as for `entropy_from_logits`.
    """
    return ChunkedLogProbs.apply(logits, labels, temperature, with_entropy, chunk_bytes)


def position_blocks(batch: int, length: int, rows: int) -> Iterator[tuple[slice, slice]]:
    """(row, column) slices covering a (batch, length) grid with at most `rows` positions each:
    whole rows when a row fits, else pieces of one row (so the logits need no flattening copy)."""
    if batch * length == 0:
        return
    if length <= rows:
        step = rows // length
        for i in range(0, batch, step):
            yield slice(i, i + step), slice(None)
    else:
        for i in range(batch):
            for j in range(0, length, rows):
                yield slice(i, i + 1), slice(j, j + rows)


def scaled_logits(block: torch.Tensor, temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """A fresh (n, V) copy of a (b, t, V) block of logits in `dtype`, divided by temperature."""
    z = torch.empty(block.shape, dtype=dtype, device=block.device)
    z.copy_(block)
    if temperature != 1.0:
        z.div_(temperature)
    return z.view(-1, block.shape[-1])  # (n, V)


def _forward_chunk(block, label, temperature, dtype, with_entropy):
    """One chunk of positions: log p of the label, max z, log Σ exp(z - max z) and the entropy
    (None unless asked), each (n, 1). Its (n, V) buffers are freed on return."""
    z = scaled_logits(block, temperature, dtype)  # (n, V)
    top = z.amax(-1, keepdim=True)  # (n, 1)
    z.sub_(top)
    logsum = z.exp().sum(-1, keepdim=True).log_()  # (n, 1)
    picked = z.gather(-1, label) - logsum  # (n, 1)
    if not with_entropy:
        return picked, top, logsum, None
    logp = z.sub_(logsum)  # (n, V)
    return picked, top, logsum, -logp.exp().mul_(logp).sum(-1, keepdim=True)


def logprob_grad_chunk(out, block, label, top, logsum, entropy, g_logp, g_entropy, temperature,
                    hit=None):
    """Writes one chunk's gradient into `out`, a (b, t, V) view of the logits' gradient; the
    per-position inputs are (n, 1), the gradients None where no gradient reached an output.
    `hit` (n, 1) bool: where the label lies in `block`'s vocabulary (a part of it, split over
    ranks; None: always)."""
    logp = scaled_logits(block, temperature, top.dtype).sub_(top).sub_(logsum)  # (n, V)
    p = logp.exp()  # (n, V)
    if g_entropy is None:
        dz = p.mul_(-g_logp)
    else:
        weight = logp.add_(entropy).mul_(g_entropy)  # g_H·(log p + H)
        if g_logp is not None:
            weight.add_(g_logp)
        dz = p.mul_(weight).neg_()  # -p·(g_logp + g_H·(log p + H))
    if g_logp is not None:  # + g_logp·onehot(label)
        dz.scatter_add_(-1, label, g_logp if hit is None else g_logp * hit)
    if temperature != 1.0:
        dz.div_(temperature)
    out.copy_(dz.view(out.shape))


class ChunkedLogProbs(torch.autograd.Function):
    """The autograd function behind `chunked_logprobs` (its arguments, in order).

    log p = (z - max z) - log Σ exp(z - max z), as log_softmax computes it: subtracting the
    maximum first keeps log p exact when all of a position's logits are large. Autograd keeps
    the logits, the labels and per position the maximum, the log-sum and the entropy.
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature, with_entropy, chunk_bytes):
        batch, length, vocab = logits.shape
        dtype = torch.promote_types(logits.dtype, torch.float32)
        rows = max(1, chunk_bytes // (_CHUNK_BUFFERS * vocab * dtype.itemsize))
        logprobs = logits.new_empty((batch, length), dtype=dtype)
        maxes, logsums = torch.empty_like(logprobs), torch.empty_like(logprobs)
        entropy = torch.empty_like(logprobs) if with_entropy else None
        for r, c in position_blocks(batch, length, rows):
            shape = labels[r, c].shape
            results = _forward_chunk(logits[r, c], labels[r, c].reshape(-1, 1), temperature,
                                     dtype, with_entropy)
            for into, result in zip((logprobs, maxes, logsums, entropy), results):
                if result is not None:
                    into[r, c] = result.view(shape)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(logits, labels, maxes, logsums, entropy)
        ctx.temperature, ctx.rows = temperature, rows
        return logprobs, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logprobs, grad_entropy):
        """d log p_y/dz = onehot(y) - p and dH/dz = -p·(log p + H) per position, with z = x / T
        (so dx = dz / T), a chunk at a time."""
        logits, labels, maxes, logsums, entropy = ctx.saved_tensors
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None, None
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        batch, length, _ = logits.shape
        for r, c in position_blocks(batch, length, ctx.rows):
            per_position = [t[r, c].reshape(-1, 1) if t is not None else None
                            for t in (labels, maxes, logsums, entropy, grad_logprobs,
                                      grad_entropy)]  # each (n, 1)
            logprob_grad_chunk(grad[r, c], logits[r, c], *per_position, ctx.temperature)
        return grad, None, None, None, None
