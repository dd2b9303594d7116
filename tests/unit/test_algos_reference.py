"""rl_core.algos in the corner cases where docs/algorithms.md compares it with verl and TRL."""

import math

import pytest
import torch

from rl_core.algos import (
    agg_loss,
    dpo_loss,
    get_advantage_estimator,
    get_policy_loss,
    masked_whiten,
)

MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

LOSS = torch.tensor([[1.0, 2.0, 3.0], [5.0, 7.0, 9.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # row 1 is empty


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 2.5),  # (1 + 2 + 3 + 4) / 4 tokens; the empty row adds nothing
        ("seq-mean-token-mean", 3.0),  # (6/3 + 4/1) / 2: two non-empty rows, not B = 3
        ("seq-mean-token-sum", 5.0),  # (6 + 4) / 2
        ("seq-mean-token-sum-norm", 5 / 3),  # (6/3 + 4/3) / 2 with H = T = 3
    ],
)
def test_empty_rows_are_left_out_of_sequence_means(mode, expected):
    torch.testing.assert_close(agg_loss(LOSS, MASK, mode), torch.tensor(expected))


def test_sum_norm_is_a_mean_over_sequences_of_sums_over_norm_len():
    # (6/4 + 4/4) / 2 = 1.25; a total token sum over H, without the mean, would be 10/4 = 2.5
    loss = agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_len=4)
    torch.testing.assert_close(loss, torch.tensor(1.25))


@pytest.mark.parametrize("mode", MODES)
def test_a_batch_without_valid_tokens_gives_zero(mode):
    # every divisor is clamped to 1, so 0 / 1 = 0 rather than 0 / 0 = NaN
    assert agg_loss(LOSS, torch.zeros_like(MASK), mode).item() == 0.0


def test_reinforce_plus_plus_carries_the_return_through_masked_positions():
    rewards = torch.tensor([[0.0, 1.0, 0.0, 2.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])  # a hole at t = 1
    advantages, returns = get_advantage_estimator("reinforce_plus_plus")(rewards, mask, gamma=0.5)
    # t=3: G = 2; t=2: G = 0 + 0.5·2 = 1; t=1 is masked: its reward is not added, G stays 1 and
    # is not discounted, the position returns 0; t=0: G = 0 + 0.5·1 = 0.5
    torch.testing.assert_close(returns, torch.tensor([[0.5, 0.0, 1.0, 2.0]]))
    assert advantages[0, 1].item() == 0.0
    # whitened over the three valid returns: they sum to 0
    torch.testing.assert_close(advantages.sum(), torch.tensor(0.0), atol=1e-6, rtol=0)


def test_whitening_one_valid_token_gives_zero():
    # mean 3, variance 0: (3 - 3) / sqrt(0 + 1e-8) = 0 on the valid token, and no error
    whitened = masked_whiten(torch.tensor([3.0, 5.0]), torch.tensor([1.0, 0.0]))
    assert whitened[0].item() == 0.0


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", -7 / 4),  # -(1 + 1 + 1 + 4) / 4 tokens
        ("seq-mean-token-mean", -2.5),  # -(3/3 + 4/1) / 2
    ],
)
def test_gspo_aggregates_with_the_given_mode(mode, expected):
    # log π = log π_old, so s = 1 and each token's loss is -A
    zeros = torch.zeros(2, 3)
    advantages = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    loss, _ = get_policy_loss("gspo")(zeros, zeros, advantages, mask, loss_agg_mode=mode)
    torch.testing.assert_close(loss, torch.tensor(expected))


def test_label_smoothing_is_the_conservative_dpo_form():
    # h = (-1 + 2) - (-3 + 2) = 2, β = 0.5, ε = 0.2: βh = 1
    pair = [torch.tensor([v]) for v in (-1.0, -3.0, -2.0, -2.0)]
    losses, _ = dpo_loss(*pair, beta=0.5, label_smoothing=0.2)
    nll_win, nll_lose = math.log1p(math.exp(-1)), math.log1p(math.exp(1))  # -log σ(±1)
    conservative = 0.8 * nll_win + 0.2 * nll_lose  # 0.8·0.31326 + 0.2·1.31326 = 0.51326
    robust = (0.8 * nll_win - 0.2 * nll_lose) / (1 - 2 * 0.2)  # TRL 1.16 `robust`: -0.02007
    torch.testing.assert_close(losses, torch.tensor([conservative]))
    assert not math.isclose(losses.item(), robust)


def test_sft_term_is_a_per_pair_token_mean():
    # chosen: summed log-probs -2 over 1 token and -3 over 3 tokens; the rest is equal, so h = 0
    chosen, same = torch.tensor([-2.0, -3.0]), torch.zeros(2)
    base, _ = dpo_loss(chosen, chosen, same, same)
    losses, metrics = dpo_loss(
        chosen, chosen, same, same, sft_loss_coef=1.0, chosen_lengths=torch.tensor([1, 3])
    )
    # per pair -log π_c / |y_c| = 2/1 and 3/3; their mean is 1.5, where the mean over all
    # chosen tokens (TRL 1.16's `sft` loss type) would be (2 + 3) / 4 = 1.25
    torch.testing.assert_close(losses - base, torch.tensor([2.0, 1.0]))
    torch.testing.assert_close(metrics["sft_loss"], torch.tensor(1.5))
