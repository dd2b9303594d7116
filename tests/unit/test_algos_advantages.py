"""Advantage estimators: hand-computed cases, slow loop references over seeds, edge cases."""

import math
import statistics

import numpy as np
import pytest
import torch

from rl_core.algos import ADVANTAGE_ESTIMATORS, compute_advantage, discounted_returns
from rl_core.algos.advantages import (
    dr_grpo,
    gae,
    grpo,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    rloo,
)

SEEDS = [0, 1, 2, 3, 4]


def f64(x):
    return torch.tensor(x, dtype=torch.float64)


def outcome(scores, T=3):
    """Token rewards (B, T) with each score on the last token, and a full mask."""
    rewards = torch.zeros(len(scores), T, dtype=torch.float64)
    rewards[:, -1] = torch.tensor(scores, dtype=torch.float64)
    return rewards, torch.ones_like(rewards)


def random_batch(seed, B=12, T=7, n_prompts=4, holes=False):
    """Random token rewards, right-padded masks (one row empty), optional interior holes."""
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = 0
    mask = (torch.arange(T) < lengths[:, None]).double()
    if holes:
        mask = mask * (torch.rand(B, T, generator=g) > 0.25).double()
    index = torch.randint(0, n_prompts, (B,), generator=g)
    index[-1] = 99  # a group of one
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    return rewards, mask, index, values


# ----------------------------------------------------------------- slow references


def groups_of(index):
    out = {}
    for i, label in enumerate(index):
        out.setdefault(label, []).append(i)
    return out.values()


def slow_scores(rewards, mask):
    return (rewards * mask).sum(-1).tolist()


def slow_group_adv(rewards, mask, index, kind, eps=1e-6):
    scores = slow_scores(rewards, mask)
    adv = [0.0] * len(scores)
    for members in groups_of(index.tolist()):
        if len(members) == 1:
            continue
        vals = [scores[i] for i in members]
        mean = sum(vals) / len(vals)
        for i in members:
            if kind == "grpo":
                adv[i] = (scores[i] - mean) / (statistics.stdev(vals) + eps)
            elif kind == "dr_grpo":
                adv[i] = scores[i] - mean
            else:  # rloo
                adv[i] = scores[i] - (sum(vals) - scores[i]) / (len(vals) - 1)
    return torch.tensor(adv, dtype=torch.float64)[:, None] * mask


def slow_whiten(x, mask):
    vals = [v for v, m in zip(x.flatten().tolist(), mask.flatten().tolist()) if m]
    mean = sum(vals) / len(vals)
    var = statistics.variance(vals) if len(vals) > 1 else 0.0
    return (x - mean) / math.sqrt(var + 1e-8) * mask


def slow_returns(rewards, mask, gamma):
    out = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        valid = [t for t in range(rewards.shape[1]) if mask[b, t]]
        running = 0.0
        for t in reversed(valid):
            running = rewards[b, t].item() + gamma * running
            out[b, t] = running
    return out


def slow_gae(rewards, mask, values, gamma, lam):
    """Textbook GAE on each row's valid tokens, compacted; the value after the last is 0."""
    adv = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        valid = [t for t in range(rewards.shape[1]) if mask[b, t]]
        next_value, running = 0.0, 0.0
        for t in reversed(valid):
            delta = rewards[b, t].item() + gamma * next_value - values[b, t].item()
            running = delta + gamma * lam * running
            adv[b, t] = running
            next_value = values[b, t].item()
    return adv


# ----------------------------------------------------------------- hand-computed


def test_grpo_two_responses_hand_computed():
    rewards, mask = outcome([1.0, 0.0])
    adv, returns = grpo(rewards, mask, torch.tensor([0, 0]))
    # mean 0.5, unbiased std sqrt((0.25 + 0.25) / 1) = 0.70711; ±0.5 / 0.70711 = ±0.70711
    expected = torch.tensor([[0.70711] * 3, [-0.70711] * 3], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert torch.equal(adv, returns)


def test_grpo_and_dr_grpo_three_responses_hand_computed():
    rewards, mask = outcome([6.0, 2.0, 4.0])
    index = ["p", "p", "p"]
    # mean 4, deviations (2, -2, 0); unbiased std sqrt((4 + 4 + 0) / 2) = 2
    # Dr. GRPO keeps the deviations; GRPO divides them by std + 1e-6
    dr, _ = dr_grpo(rewards, mask, index)
    torch.testing.assert_close(dr[:, 0], f64([2.0, -2.0, 0.0]))
    adv, _ = grpo(rewards, mask, index)
    torch.testing.assert_close(adv[:, 0], f64([1.0, -1.0, 0.0]), atol=1e-5, rtol=0)


def test_rloo_hand_computed():
    rewards, mask = outcome([3.0, 1.0, 2.0])
    adv, _ = rloo(rewards, mask, torch.tensor([7, 7, 7]))
    # 3 - (1 + 2)/2 = 1.5;  1 - (3 + 2)/2 = -1.5;  2 - (3 + 1)/2 = 0
    torch.testing.assert_close(adv[:, 0], f64([1.5, -1.5, 0.0]))


def test_outcome_score_ignores_rewards_on_padding():
    rewards = torch.tensor([[0.0, 1.0, 9.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    adv, _ = dr_grpo(rewards, mask, [0, 0])
    # scores (1, 0): the 9 sits on padding; mean 0.5 -> (0.5, -0.5), zero on padding
    torch.testing.assert_close(adv, f64([[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5]]))


def test_reinforce_plus_plus_hand_computed():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    mask = torch.ones_like(rewards)
    adv, returns = reinforce_plus_plus(rewards, mask, gamma=0.5)
    # returns: G2 = 1, G1 = 0 + 0.5·1 = 0.5, G0 = 0 + 0.5·0.5 = 0.25
    torch.testing.assert_close(returns, torch.tensor([[0.25, 0.5, 1.0]], dtype=torch.float64))
    # mean 0.58333, unbiased var (0.11111 + 0.00694 + 0.17361) / 2 = 0.14583, std 0.38188
    expected = torch.tensor([[-0.87287, -0.21822, 1.09109]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_discounted_returns_skip_padding_and_holes():
    rewards = torch.tensor([[1.0, 5.0, 2.0, 7.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    # valid tokens 0 and 2: G2 = 2, G0 = 1 + 0.5·2 = 2; the hole at 1 neither adds nor discounts
    expected = torch.tensor([[2.0, 0.0, 2.0, 0.0]])
    torch.testing.assert_close(discounted_returns(rewards, mask, 0.5), expected)


def test_reinforce_plus_plus_baseline_hand_computed():
    rewards, mask = outcome([2.0, 0.0, 5.0], T=2)
    adv, returns = reinforce_plus_plus_baseline(rewards, mask, ["a", "a", "b"])
    # group a mean 1 -> (1, -1); b is alone -> 0. Tokens (1, 1, -1, -1, 0, 0):
    # mean 0, unbiased var 4 / 5 = 0.8, so ±1 / sqrt(0.8) = ±1.11803
    expected = f64([[1.11803, 1.11803], [-1.11803, -1.11803], [0.0, 0.0]])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert torch.equal(adv, returns)


def test_gae_hand_computed():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.5, 0.5]], dtype=torch.float64)
    mask = torch.ones_like(rewards)
    _, returns = gae(rewards, mask, values, gamma=0.9, lam=0.5)
    # delta2 = 1 + 0 - 0.5 = 0.5;   delta1 = delta0 = 0 + 0.9·0.5 - 0.5 = -0.05
    # A2 = 0.5;  A1 = -0.05 + 0.45·0.5 = 0.175;  A0 = -0.05 + 0.45·0.175 = 0.02875
    # returns = A + V = (0.52875, 0.675, 1.0)
    torch.testing.assert_close(returns, torch.tensor([[0.52875, 0.675, 1.0]], dtype=torch.float64))


def test_gae_with_gamma_lam_one_is_return_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.25, 0.0], [1.0, 1.0, 9.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    _, returns = gae(rewards, mask, values)
    # gamma = lam = 1: returns are plain reward-to-go; the value 9 sits on padding
    torch.testing.assert_close(returns, f64([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))


# ----------------------------------------------------------------- against loops


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo"])
def test_group_estimators_match_loop(seed, kind):
    rewards, mask, index, _ = random_batch(seed)
    fn = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo}[kind]
    adv, returns = fn(rewards, mask, index)
    torch.testing.assert_close(adv, slow_group_adv(rewards, mask, index, kind))
    assert torch.equal(adv, returns)


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_matches_loop(seed):
    rewards, mask, _, _ = random_batch(seed, holes=True)
    adv, returns = reinforce_plus_plus(rewards, mask, gamma=0.9)
    expected_returns = slow_returns(rewards, mask, 0.9)
    torch.testing.assert_close(returns, expected_returns)
    torch.testing.assert_close(adv, slow_whiten(expected_returns, mask))


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_baseline_matches_loop(seed):
    rewards, mask, index, _ = random_batch(seed)
    scores = slow_scores(rewards, mask)
    centred = [0.0] * len(scores)
    for members in groups_of(index.tolist()):
        mean = sum(scores[i] for i in members) / len(members)
        for i in members:
            centred[i] = scores[i] - mean
    expected = slow_whiten(torch.tensor(centred, dtype=torch.float64)[:, None] * mask, mask)
    torch.testing.assert_close(reinforce_plus_plus_baseline(rewards, mask, index)[0], expected)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("holes", [False, True])
def test_gae_matches_loop(seed, holes):
    rewards, mask, _, values = random_batch(seed, holes=holes)
    adv, returns = gae(rewards, mask, values, gamma=0.95, lam=0.9)
    raw = slow_gae(rewards, mask, values, 0.95, 0.9)
    torch.testing.assert_close(returns, (raw + values) * mask)
    torch.testing.assert_close(adv, slow_whiten(raw, mask))


# ----------------------------------------------------------------- edge cases


@pytest.mark.parametrize("fn", [grpo, dr_grpo, rloo])
def test_group_of_one_gets_zero_not_nan(fn):
    rewards, mask = outcome([5.0, 1.0, 0.0])
    adv, _ = fn(rewards, mask, ["alone", "pair", "pair"])
    assert torch.isfinite(adv).all()
    assert torch.equal(adv[0], torch.zeros(3, dtype=torch.float64))
    assert adv[1, 0] > 0 > adv[2, 0]


def test_grpo_equal_rewards_give_zero_advantage():
    rewards, mask = outcome([1.0, 1.0, 1.0, 1.0])
    adv, _ = grpo(rewards, mask, [0, 0, 0, 0])
    assert torch.equal(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_all_masked_rows_and_batches_stay_finite_and_zero(name):
    rewards, mask, index, values = random_batch(0)
    for m in (mask, torch.zeros_like(mask)):
        adv, returns = compute_advantage(
            name, rewards, m, index=index, values=values, gamma=0.9, lam=0.9
        )
        assert torch.isfinite(adv).all() and torch.isfinite(returns).all()
        assert torch.equal(adv * (1 - m), torch.zeros_like(adv))  # zero on padding
        assert torch.equal(returns * (1 - m), torch.zeros_like(returns))


def test_index_forms_agree():
    rewards, mask, index, _ = random_batch(3)
    labels = [f"uid-{i}" for i in index.tolist()]
    by_tensor = grpo(rewards, mask, index)[0]
    torch.testing.assert_close(grpo(rewards, mask, labels)[0], by_tensor)
    torch.testing.assert_close(grpo(rewards, mask, np.array(labels, dtype=object))[0], by_tensor)


def test_advantages_carry_no_graph():
    rewards, mask, index, values = random_batch(1)
    values.requires_grad_(True)
    adv, returns = gae(rewards, mask, values)
    assert not adv.requires_grad and not returns.requires_grad


def test_compute_advantage_passes_only_what_each_estimator_takes():
    rewards, mask, index, values = random_batch(2)
    opts = dict(gamma=0.9, lam=0.8, epsilon=1e-6, norm_adv_by_std=False)
    got = compute_advantage("dr_grpo", rewards, mask, index=index, values=values, **opts)
    torch.testing.assert_close(got[0], dr_grpo(rewards, mask, index)[0])
    got = compute_advantage("gae", rewards, mask, index=index, values=values, **opts)
    torch.testing.assert_close(got[1], gae(rewards, mask, values, 0.9, 0.8)[1])
    got = compute_advantage("grpo", rewards, mask, index=index, norm_adv_by_std=False)
    torch.testing.assert_close(got[0], dr_grpo(rewards, mask, index)[0])


def test_compute_advantage_names_missing_inputs_and_unknown_options():
    rewards, mask, index, _ = random_batch(0)
    with pytest.raises(ValueError, match="'rloo' needs `index`"):
        compute_advantage("rloo", rewards, mask)
    with pytest.raises(ValueError, match="'gae' needs `values`"):
        compute_advantage("gae", rewards, mask, index=index)
    with pytest.raises(TypeError, match="norm_adv_by_std_in_grpo"):
        compute_advantage("grpo", rewards, mask, index=index, norm_adv_by_std_in_grpo=False)
