"""Policy losses: PPO clip (clip-higher, dual clip), GSPO; values, metrics and gradients."""

import math

import pytest
import torch

from rl_core.algos.masked import masked_mean
from rl_core.algos.policy_loss import gspo_loss, ppo_clip_loss


def f64(x):
    return torch.tensor(x, dtype=torch.float64)


def at_ratios(ratios, advantages, **kwargs):
    """ppo_clip_loss of one row with old log-prob 0 and the given ratios; also returns log_prob."""
    log_prob = f64([[math.log(r) for r in ratios]]).requires_grad_(True)
    adv = f64([advantages])
    old = torch.zeros_like(log_prob)
    loss, metrics = ppo_clip_loss(old, log_prob, adv, torch.ones_like(adv), **kwargs)
    return loss, metrics, log_prob


def test_ppo_clip_positive_advantage_hand_computed():
    loss, metrics, _ = at_ratios([0.5, 1.0, 1.5], [1.0, 1.0, 1.0])
    # tokens: max(-0.5, -0.8) = -0.5;  -1;  max(-1.5, -1.2) = -1.2  -> mean -2.7 / 3 = -0.9
    torch.testing.assert_close(loss, f64(-0.9))
    # the clip binds only on the third token
    torch.testing.assert_close(metrics["pg_clipfrac"], f64(1 / 3))
    assert metrics["pg_clipfrac_lower"] == 0
    # ppo_kl = mean(-log r) = -(ln 0.5 + 0 + ln 1.5) / 3 = 0.09589
    torch.testing.assert_close(metrics["ppo_kl"], f64(0.09589), atol=1e-5, rtol=0)


def test_ppo_dual_clip_caps_negative_advantage_loss():
    loss, metrics, _ = at_ratios([0.5, 1.0, 5.0], [-1.0, -1.0, -1.0], clip_ratio_c=3.0)
    # PPO: max(0.5, 0.8) = 0.8;  1;  max(5, 1.2) = 5 -> dual clip min(5, 3·1) = 3; mean 4.8 / 3
    torch.testing.assert_close(loss, f64(1.6))
    torch.testing.assert_close(metrics["pg_clipfrac"], f64(1 / 3))  # token 0
    torch.testing.assert_close(metrics["pg_clipfrac_lower"], f64(1 / 3))  # token 2


def test_dual_clip_leaves_positive_advantages_alone():
    loss, metrics, _ = at_ratios([5.0], [1.0], clip_ratio_c=3.0)
    # A > 0: max(-5, -1.2) = -1.2; the dual clip applies to A < 0 only
    torch.testing.assert_close(loss, f64(-1.2))
    assert metrics["pg_clipfrac_lower"] == 0


def test_clip_higher_widens_only_the_upper_bound():
    # ratio 1.25, A = 1: symmetric 0.2 clips to 1.2; clip_ratio_high 0.28 leaves 1.25 alone
    torch.testing.assert_close(at_ratios([1.25], [1.0])[0], f64(-1.2))
    torch.testing.assert_close(at_ratios([1.25], [1.0], clip_ratio_high=0.28)[0], f64(-1.25))
    # ratio 0.75, A = -1: the lower bound stays 1 - 0.2 = 0.8 -> loss max(0.75, 0.8) = 0.8
    torch.testing.assert_close(at_ratios([0.75], [-1.0], clip_ratio_high=0.28)[0], f64(0.8))


def test_gradient_is_zero_where_clipped():
    ratios = [1.5, 1.1, 0.5, 5.0, 2.0]
    advantages = [1.0, 1.0, -1.0, -1.0, -1.0]
    loss, _, log_prob = at_ratios(ratios, advantages, clip_ratio_c=3.0)
    loss.backward()
    # d(-A·r)/d log π = -A·r, over 5 tokens; clipped tokens (1.5 with A>0, 0.5 with A<0) and the
    # dual-clipped one (5 with A<0, loss fixed at 3) get 0; ratio 2 < c = 3 is not dual-clipped
    expected = f64([[0.0, -1.1, 0.0, 0.0, 2.0]]) / 5
    torch.testing.assert_close(log_prob.grad, expected)


def test_ppo_loss_gradcheck_float64():
    g = torch.Generator().manual_seed(0)
    old = torch.randn(3, 4, generator=g, dtype=torch.float64)
    log_prob = old + 0.3 * torch.randn(3, 4, generator=g, dtype=torch.float64)
    log_prob.requires_grad_(True)
    adv = torch.randn(3, 4, generator=g, dtype=torch.float64)
    mask = f64([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    for mode in ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]:
        fn = lambda lp: ppo_clip_loss(old, lp, adv, mask, loss_agg_mode=mode)[0]  # noqa: E731
        assert torch.autograd.gradcheck(fn, (log_prob,))


def test_extreme_log_ratios_stay_finite():
    log_prob = f64([[1000.0, -1000.0, 30.0]]).requires_grad_(True)
    adv = f64([[1.0, -1.0, -1.0]])
    for fn in (ppo_clip_loss, gspo_loss):
        loss, metrics = fn(torch.zeros_like(log_prob), log_prob, adv, torch.ones_like(adv))
        (grad,) = torch.autograd.grad(loss, log_prob)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert all(torch.isfinite(v) for v in metrics.values())


def test_padding_does_not_count():
    old = torch.zeros(1, 3, dtype=torch.float64)
    log_prob = f64([[0.1, 0.2, 50.0]]).requires_grad_(True)
    adv = f64([[1.0, 1.0, 1.0]])
    mask = f64([[1.0, 1.0, 0.0]])
    loss, metrics = ppo_clip_loss(old, log_prob, adv, mask)
    # (-e^0.1 - 1.2) / 2: the ratio e^0.2 = 1.2214 is clipped to 1.2; token 2 is padding
    torch.testing.assert_close(loss, f64((-math.exp(0.1) - 1.2) / 2))
    torch.testing.assert_close(metrics["ppo_kl"], f64(-0.15))
    loss.backward()
    assert log_prob.grad[0, 2] == 0


def test_clip_ratio_c_must_exceed_one():
    with pytest.raises(ValueError, match="clip_ratio_c"):
        at_ratios([1.0], [1.0], clip_ratio_c=1.0)


def test_all_masked_batch_gives_zero_loss():
    x = torch.zeros(2, 3)
    for fn in (ppo_clip_loss, gspo_loss):
        loss, metrics = fn(x, x, x + 1, x)
        assert loss == 0 and all(v == 0 for v in metrics.values())


# ----------------------------------------------------------------- GSPO


def test_gspo_sequence_ratio_hand_computed():
    old = torch.zeros(1, 3, dtype=torch.float64)
    log_prob = f64([[0.3, -0.1, 7.0]])
    mask = f64([[1.0, 1.0, 0.0]])
    adv = f64([[1.0, 1.0, 1.0]])
    loss, metrics = gspo_loss(old, log_prob, adv, mask, clip_ratio_low=0.5, clip_ratio_high=0.5)
    # s = exp(mean(0.3, -0.1)) = exp(0.1) = 1.10517 (padding ignored); loss -A·s on each token
    torch.testing.assert_close(loss, f64(-math.exp(0.1)))
    assert metrics["pg_clipfrac"] == 0
    loss, metrics = gspo_loss(old, log_prob, adv, mask, clip_ratio_low=0.05, clip_ratio_high=0.05)
    # 1.10517 > 1.05: clipped to 1.05 on both valid tokens
    torch.testing.assert_close(loss, f64(-1.05))
    assert metrics["pg_clipfrac"] == 1


def paper_gspo_loss(old, log_prob, adv, mask):
    """Sequence-level GSPO without clipping: mean over sequences of -A_i · s_i(θ)."""
    s = torch.exp(masked_mean(log_prob - old, mask, dim=-1))  # (B,)
    return (-adv[:, 0] * s).mean()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_gradient_matches_sequence_level_paper_form(seed):
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(4, 5, generator=g, dtype=torch.float64)
    log_prob = old + 0.1 * torch.randn(4, 5, generator=g, dtype=torch.float64)
    log_prob.requires_grad_(True)
    adv = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, 5)  # one A per sequence
    mask = f64([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])
    wide = dict(clip_ratio_low=0.9, clip_ratio_high=9.0)  # no clipping
    loss, _ = gspo_loss(old, log_prob, adv, mask, **wide, loss_agg_mode="seq-mean-token-mean")
    (grad,) = torch.autograd.grad(loss, log_prob)
    (expected,) = torch.autograd.grad(paper_gspo_loss(old, log_prob, adv, mask), log_prob)
    torch.testing.assert_close(loss, paper_gspo_loss(old, log_prob, adv, mask))
    torch.testing.assert_close(grad, expected)


def test_gspo_clipped_sequence_gets_no_gradient():
    old = torch.zeros(2, 2, dtype=torch.float64)
    log_prob = f64([[0.5, 0.5], [0.01, 0.01]]).requires_grad_(True)
    adv = torch.ones(2, 2, dtype=torch.float64)
    loss, _ = gspo_loss(old, log_prob, adv, torch.ones_like(adv))
    loss.backward()
    # row 0: s = e^0.5 = 1.65 > 1.2 with A > 0 -> clipped, no gradient; row 1: s = e^0.01
    assert torch.equal(log_prob.grad[0], torch.zeros(2, dtype=torch.float64))
    # d/d log π_t of mean_i mean_t(-A·s_i) = -s / (2 sequences · 2 tokens)
    torch.testing.assert_close(log_prob.grad[1], f64([-math.exp(0.01) / 4] * 2))
