"""Token entropy and log-probs from logits, and the clipped value loss."""

import math

import pytest
import torch

from rl_core.algos import entropy_from_logits, log_probs_from_logits, value_loss


def test_entropy_hand_computed():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    # uniform over 4: ln 4 = 1.38629; one dominant logit: ~3·e^-100·100, i.e. 0
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([[math.log(4), 0.0]]))
    # p = (0.5, 0.25, 0.25) from logits ln(2, 1, 1): H = 0.5 ln 2 + 2 · 0.25 ln 4 = 1.5 ln 2
    half = torch.log(torch.tensor([[[2.0, 1.0, 1.0]]]))
    torch.testing.assert_close(entropy_from_logits(half), torch.tensor([[1.5 * math.log(2)]]))


@pytest.mark.parametrize("seed", range(3))
def test_entropy_matches_naive_formula(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 3, 11, generator=g, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy_from_logits(logits), -(p * p.log()).sum(-1))


def test_entropy_is_finite_for_extreme_logits():
    logits = torch.tensor([[[1e4, -1e4, 0.0], [-3e4, -3e4, -3e4]]], requires_grad=True)
    ent = entropy_from_logits(logits)
    ent.sum().backward()
    assert torch.isfinite(ent).all() and torch.isfinite(logits.grad).all()
    torch.testing.assert_close(ent[0, 1], torch.tensor(math.log(3)))


def test_entropy_gradcheck_float64():
    logits = torch.randn(2, 2, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.autograd.gradcheck(entropy_from_logits, (logits.requires_grad_(True),))


def test_log_probs_from_logits():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]]))
    labels = torch.tensor([[1, 2]])
    # picks log 0.25 and log 0.7
    expected = torch.log(torch.tensor([[0.25, 0.7]]))
    torch.testing.assert_close(log_probs_from_logits(logits, labels), expected)
    big = torch.randn(3, 4, 50, generator=torch.Generator().manual_seed(1)) * 30
    labels = torch.randint(0, 50, (3, 4))
    naive = torch.log_softmax(big, -1).gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(log_probs_from_logits(big, labels), naive)


# ----------------------------------------------------------------- value loss


def test_value_loss_hand_computed():
    values = torch.tensor([[1.0, 2.0, 7.0]], requires_grad=True)
    old_values = torch.tensor([[0.0, 2.0, 0.0]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = value_loss(values, old_values, returns, mask, cliprange_value=0.5)
    # token 0: clipped V = 0 + clip(1, ±0.5) = 0.5; max((1-2)², (0.5-2)²) = max(1, 2.25) = 2.25
    # token 1: V = V_old = 2: (2-1)² = 1 both;  token 2 is padding
    # 0.5 · (2.25 + 1) / 2 = 0.8125
    torch.testing.assert_close(loss, torch.tensor(0.8125))
    torch.testing.assert_close(metrics["vf_clipfrac"], torch.tensor(0.5))
    loss.backward()
    # token 0 takes the clipped branch (constant in V): no gradient; token 1: 0.5·2·(2-1)/2 = 0.5
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.5, 0.0]]))


@pytest.mark.parametrize("seed", range(3))
def test_value_loss_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    values, old_values, returns = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(4, 5, generator=g) > 0.3).double()
    total, count, clipped = 0.0, 0, 0
    columns = (x.flatten().tolist() for x in (values, old_values, returns, mask))
    for v, o, r, m in zip(*columns):
        if not m:
            continue
        vc = min(max(v, o - 0.2), o + 0.2)
        total += max((v - r) ** 2, (vc - r) ** 2)
        count += 1
        clipped += (vc - r) ** 2 > (v - r) ** 2
    loss, metrics = value_loss(values, old_values, returns, mask, cliprange_value=0.2)
    torch.testing.assert_close(loss.item(), 0.5 * total / count)
    torch.testing.assert_close(metrics["vf_clipfrac"].item(), clipped / count)


def test_values_inside_the_clip_range_are_never_counted_as_clipped():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(64, 16, generator=g)
    values = old + 1e-3 * torch.randn(64, 16, generator=g)  # within the range, not equal to it
    returns = torch.randn(64, 16, generator=g)
    mask = torch.ones(64, 16)
    _, metrics = value_loss(values, old, returns, mask, cliprange_value=0.5)
    assert metrics["vf_clipfrac"] == 0
    _, metrics = value_loss(old + 1.0, old, returns, mask, cliprange_value=0.5)  # all outside
    assert 0 < metrics["vf_clipfrac"] < 1  # clipped where the clipped loss is the larger
