"""KL estimators, the KL loss and in-reward penalty, and the KL controllers."""

import math

import pytest
import torch

from rl_core.algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_estimator,
    kl_loss,
    make_kl_controller,
)
from rl_core.algos.kl import kl_k3

LN2 = math.log(2)
# log π = ln 0.5, log π_ref = ln 0.25, so log π - log π_ref = ln 2 = 0.69315
LOGP = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
REF = torch.tensor([[math.log(0.25)]], dtype=torch.float64)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("k1", LN2),  # ln 2 = 0.69315
        ("abs", LN2),
        ("k2", 0.5 * LN2**2),  # 0.5 · 0.48045 = 0.24023
        ("mse", 0.5 * LN2**2),
        ("k3", 0.5 + LN2 - 1),  # d = -ln 2: e^d - d - 1 = 0.5 + 0.69315 - 1 = 0.19315
        ("low_var_kl", 0.5 + LN2 - 1),
    ],
)
def test_estimators_hand_computed(name, expected):
    torch.testing.assert_close(get_kl_estimator(name)(LOGP, REF).item(), expected)


def test_signs_k1_signed_others_non_negative():
    logp, ref = torch.tensor([[-2.0, -1.0]]), torch.tensor([[-1.0, -2.0]])
    torch.testing.assert_close(get_kl_estimator("k1")(logp, ref), torch.tensor([[-1.0, 1.0]]))
    for name in ("abs", "k2", "k3"):
        assert (get_kl_estimator(name)(logp, ref) >= 0).all()


def test_k3_gradient_is_analytic():
    logp = LOGP.clone().requires_grad_(True)
    kl_k3(logp, REF).sum().backward()
    # d/d log π (e^(ref - logp) - (ref - logp) - 1) = 1 - e^(ref - logp) = 1 - 0.5 = 0.5
    torch.testing.assert_close(logp.grad, torch.tensor([[0.5]], dtype=torch.float64))


def test_k3_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    ref = torch.randn(3, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(kl_k3, (logp, ref))


@pytest.mark.parametrize("name", ["k1", "abs", "k2", "k3"])
def test_extreme_log_ratios_stay_finite(name):
    logp = torch.tensor([[-1000.0, 0.0, -50.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -1000.0, 0.0]])
    value = get_kl_estimator(name)(logp, ref)
    value.sum().backward()
    assert torch.isfinite(value).all() and torch.isfinite(logp.grad).all()
    if name == "k3":
        assert value.max() <= 10.0


def test_kl_loss_aggregates_with_mask():
    logp = torch.tensor([[0.0, -1.0, 5.0]])
    ref = torch.tensor([[-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # k1 per token (1, 0, 5); token-mean over the two valid tokens = 0.5
    torch.testing.assert_close(kl_loss(logp, ref, mask, "k1"), torch.tensor(0.5))


def test_kl_loss_sum_norm_divides_by_the_fixed_horizon_not_the_padding():
    logp = torch.tensor([[0.0, -1.0]])
    ref = torch.tensor([[-1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0]])
    # k1 per token (1, 0): token sum 1, over the horizon 4 = 0.25, however wide the padding
    for pad in (0, 3):
        padded = [torch.nn.functional.pad(t, (0, pad)) for t in (logp, ref, mask)]
        loss = kl_loss(*padded, "k1", loss_agg_mode="seq-mean-token-sum-norm", norm_len=4)
        torch.testing.assert_close(loss, torch.tensor(0.25))


def test_apply_kl_penalty_hand_computed():
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    logp = torch.tensor([[-1.0, -1.0, 3.0], [-1.0, -1.0, -1.0]])
    ref = torch.tensor([[-2.0, -1.5, 0.0], [-1.0, -1.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    new_rewards, current_kl = apply_kl_penalty(rewards, logp, ref, mask, coef=0.1, estimator="k1")
    # k1 = (1, 0.5, [padding]) and (0, 0, 2); rewards - 0.1·k1; padding untouched
    expected = torch.tensor([[-0.1, 0.95, 0.0], [0.0, 0.0, -0.2]])
    torch.testing.assert_close(new_rewards, expected)
    # per-sequence mean KL (0.75, 0.6667), batch mean 0.70833
    torch.testing.assert_close(current_kl, torch.tensor((0.75 + 2 / 3) / 2))


def test_fixed_controller_never_moves():
    ctrl = make_kl_controller("fixed", 0.05)
    ctrl.update(current_kl=9.0, n_steps=100)
    assert isinstance(ctrl, FixedKLController) and ctrl.value == 0.05


@pytest.mark.parametrize(
    "current_kl, expected",
    [
        (0.5, 0.102),  # KL/target - 1 = 4, clipped to 0.2: 0.1 · (1 + 0.2 · 10/100)
        (0.11, 0.101),  # error 0.1: 0.1 · (1 + 0.1 · 10/100) = 0.101
        (0.1, 0.1),  # on target: unchanged
        (0.0, 0.098),  # error -1, clipped to -0.2: 0.1 · (1 - 0.02)
    ],
)
def test_adaptive_controller_hand_computed(current_kl, expected):
    ctrl = make_kl_controller("adaptive", 0.1, target=0.1, horizon=100)
    ctrl.update(current_kl, n_steps=10)
    assert isinstance(ctrl, AdaptiveKLController)
    assert math.isclose(ctrl.value, expected)


def test_adaptive_controller_moves_kl_toward_target():
    ctrl = AdaptiveKLController(0.1, target=0.1, horizon=10)
    for _ in range(5):
        ctrl.update(torch.tensor(1.0), n_steps=1)  # KL too high -> coefficient grows
    assert ctrl.value > 0.1
    with pytest.raises(ValueError, match="positive"):
        AdaptiveKLController(0.1, target=0.0, horizon=10)
