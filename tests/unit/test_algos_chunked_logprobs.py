"""Chunked log-probs and entropy: the direct float32 computation's values and gradients, chunk
by chunk, with autograd keeping no float32 copy of the logits."""

import math

import pytest
import torch

from rl_core.algos import chunked_logprobs
from rl_core.engines.train import token_logprobs

V = 37


def chunk_of(rows: int, vocab: int = V) -> int:
    """The chunk_bytes that gives chunks of `rows` positions (two float32 buffers a chunk)."""
    return rows * 2 * vocab * 4


def direct(logits, labels, temperature=1.0, with_entropy=False):
    """The whole (B, T, V) in float32: log_softmax gathered at the labels, -Σ p·log p."""
    logp = torch.log_softmax(logits.float() / temperature, -1)  # (B, T, V)
    picked = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked, (-(logp.exp() * logp).sum(-1) if with_entropy else None)


def weighted(outputs, weights):
    """A scalar that sends the gradient `weights[i]` into output i (none into a None weight)."""
    return sum((out * w).sum() for out, w in zip(outputs, weights) if w is not None)


def grads(fn, logits, labels, weights, **kw):
    x = logits.detach().clone().requires_grad_(True)
    outputs = fn(x, labels, **kw)
    (grad,) = torch.autograd.grad(weighted(outputs, weights), x)
    return outputs, grad


def case(seed, batch=3, length=11, dtype=torch.float32, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, length, V, generator=g) * scale).to(dtype)
    labels = torch.randint(0, V, (batch, length), generator=g)
    return logits, labels, g


def test_hand_computed():
    # p = (0.5, 0.25, 0.25) and (0.1, 0.2, 0.7); labels 1 and 2 pick log 0.25 and log 0.7;
    # H = 0.5 ln 2 + 2 · 0.25 ln 4 = 1.5 ln 2, and -(0.1 ln 0.1 + 0.2 ln 0.2 + 0.7 ln 0.7)
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]]))
    logp, ent = chunked_logprobs(logits, torch.tensor([[1, 2]]), with_entropy=True,
                                 chunk_bytes=1)
    torch.testing.assert_close(logp, torch.log(torch.tensor([[0.25, 0.7]])))
    h2 = -sum(p * math.log(p) for p in (0.1, 0.2, 0.7))
    torch.testing.assert_close(ent, torch.tensor([[1.5 * math.log(2), h2]]))


# chunks of 1 row, of 4 (11 columns split 4 + 4 + 3), of two whole rows (3 rows: 2 + 1), all
@pytest.mark.parametrize("rows", [1, 4, 22, 10_000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("seed", range(2))
def test_float32_matches_direct_values_and_gradients(rows, temperature, with_entropy, seed):
    logits, labels, g = case(seed)
    weights = [torch.randn(labels.shape, generator=g),
               torch.randn(labels.shape, generator=g) if with_entropy else None]
    kw = {"temperature": temperature, "with_entropy": with_entropy}
    want, want_grad = grads(direct, logits, labels, weights, **kw)
    got, got_grad = grads(chunked_logprobs, logits, labels, weights, chunk_bytes=chunk_of(rows),
                          **kw)
    assert got[0].dtype == torch.float32 and got_grad.dtype == torch.float32
    torch.testing.assert_close(got[0], want[0])
    if with_entropy:
        torch.testing.assert_close(got[1], want[1])
    else:
        assert got[1] is None
    torch.testing.assert_close(got_grad, want_grad)


@pytest.mark.parametrize("with_entropy", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_bfloat16_input_gives_float32_values_and_a_bfloat16_gradient(with_entropy, temperature):
    logits, labels, g = case(0, dtype=torch.bfloat16)
    weights = [torch.randn(labels.shape, generator=g),
               torch.randn(labels.shape, generator=g) if with_entropy else None]
    kw = {"temperature": temperature, "with_entropy": with_entropy}
    want, want_grad = grads(direct, logits, labels, weights, **kw)
    got, got_grad = grads(chunked_logprobs, logits, labels, weights, chunk_bytes=chunk_of(4),
                          **kw)
    assert got[0].dtype == torch.float32 and got_grad.dtype == torch.bfloat16
    torch.testing.assert_close(got[0], want[0])
    if with_entropy:
        torch.testing.assert_close(got[1], want[1])
    torch.testing.assert_close(got_grad, want_grad)  # bfloat16 tolerances


@pytest.mark.parametrize("used", ["logprobs", "entropy"])
def test_gradient_through_one_output_of_two(used):
    logits, labels, g = case(1)
    w = torch.randn(labels.shape, generator=g)
    weights = [w, None] if used == "logprobs" else [None, w]
    kw = {"temperature": 0.8, "with_entropy": True}
    _, want_grad = grads(direct, logits, labels, weights, **kw)
    _, got_grad = grads(chunked_logprobs, logits, labels, weights, chunk_bytes=chunk_of(5), **kw)
    torch.testing.assert_close(got_grad, want_grad)


@pytest.mark.parametrize("rows", [1, 3, 100])
def test_gradcheck_float64(rows):
    logits, labels, _ = case(2, batch=2, length=4, dtype=torch.float64)
    x = logits[..., :7].contiguous().requires_grad_(True)  # (2, 4, 7)
    labels = labels % 7
    chunk = chunk_of(rows, 7) * 2  # float64: 8 bytes an element
    assert torch.autograd.gradcheck(
        lambda z: chunked_logprobs(z, labels, 0.7, True, chunk), (x,))
    assert torch.autograd.gradcheck(
        lambda z: chunked_logprobs(z, labels, 1.3, False, chunk)[0], (x,))


def test_extreme_logits_are_finite_and_exact():
    logits = torch.tensor([[[1e4, -1e4, 0.0], [-3e4, -3e4, -3e4], [5e3, 5e3, -5e3]]])
    labels = torch.tensor([[1, 0, 2]])
    weights = [torch.ones(1, 3), torch.ones(1, 3)]
    got, got_grad = grads(chunked_logprobs, logits, labels, weights, with_entropy=True,
                          chunk_bytes=1)
    want, want_grad = grads(direct, logits.double(), labels, weights, with_entropy=True)
    assert all(torch.isfinite(t).all() for t in (*got, got_grad))
    torch.testing.assert_close(got[0], want[0].float())
    torch.testing.assert_close(got[1], want[1].float())
    torch.testing.assert_close(got_grad, want_grad.float())
    torch.testing.assert_close(got[1][0, 1], torch.tensor(math.log(3)))


def test_a_strided_view_of_the_logits():
    # a model's logits with one position too many, sliced as the LM head's caller does
    full, labels, g = case(3, length=12)
    labels = labels[:, :-1]
    weights = [torch.randn(3, 11, generator=g), torch.randn(3, 11, generator=g)]
    results = []
    for fn, kw in ((direct, {}), (chunked_logprobs, {"chunk_bytes": chunk_of(4)})):
        x = full.clone().requires_grad_(True)
        outputs = fn(x[:, :-1], labels, with_entropy=True, **kw)  # (3, 11, V), not contiguous
        results.append((outputs, torch.autograd.grad(weighted(outputs, weights), x)[0]))
    (want, want_grad), (got, got_grad) = results
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    torch.testing.assert_close(got_grad, want_grad)


def test_no_positions():
    logits = torch.zeros(2, 0, V, requires_grad=True)
    logp, ent = chunked_logprobs(logits, torch.zeros(2, 0, dtype=torch.long), with_entropy=True)
    assert logp.shape == ent.shape == (2, 0)
    (logp.sum() + ent.sum()).backward()
    assert logits.grad.shape == logits.shape


def saved_by(fn, logits, labels, **kw):
    """The tensors autograd keeps for backward while `fn` runs."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(logits, labels, **kw)
    return saved


@pytest.mark.parametrize("with_entropy", [False, True])
def test_backward_keeps_no_float32_copy_of_the_logits(with_entropy):
    logits, labels, _ = case(4, dtype=torch.bfloat16)
    logits.requires_grad_(True)
    kw = {"temperature": 0.7, "with_entropy": with_entropy}
    saved = saved_by(chunked_logprobs, logits, labels, chunk_bytes=chunk_of(4), **kw)
    wide = [t for t in saved if t.dim() and t.shape[-1] == V]
    assert len(wide) == 1 and wide[0].dtype == torch.bfloat16  # the logits themselves
    assert wide[0].data_ptr() == logits.data_ptr()
    assert sum(t.numel() * t.element_size() for t in saved if t is not wide[0]) <= (
        labels.numel() * (8 + 4 * 3))  # labels; max, log-sum, entropy

    old = saved_by(direct, logits, labels, **kw)  # the whole (B, T, V) in float32
    assert any(t.dtype == torch.float32 and t.shape == (*labels.shape, V) for t in old)


def test_float32_input_is_kept_as_is():
    logits, labels, _ = case(5)
    logits.requires_grad_(True)
    saved = saved_by(token_logprobs, logits, labels, temperature=0.7, with_entropy=True)
    wide = [t for t in saved if t.dim() and t.shape[-1] == V]
    assert len(wide) == 1 and wide[0].data_ptr() == logits.data_ptr()


@pytest.mark.parametrize("with_entropy", [False, True])
def test_token_logprobs_is_the_chunked_function(with_entropy):
    logits, labels, _ = case(6, dtype=torch.bfloat16)
    got = token_logprobs(logits, labels, 0.9, with_entropy)
    want = direct(logits, labels, 0.9, with_entropy)
    torch.testing.assert_close(got[0], want[0])
    if with_entropy:
        torch.testing.assert_close(got[1], want[1])
    else:
        assert got[1] is None
