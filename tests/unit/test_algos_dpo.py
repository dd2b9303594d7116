"""DPO losses (sigmoid with label smoothing, IPO, hinge), reward metrics and the SFT term."""

import math

import pytest
import torch
import torch.nn.functional as F

from rl_core.algos import dpo_loss

# chosen log-ratio -1 - (-2) = 1, rejected -3 - (-2) = -1, so h = 1 - (-1) = 2
PAIR = dict(
    policy_chosen_logps=torch.tensor([-1.0]),
    policy_rejected_logps=torch.tensor([-3.0]),
    reference_chosen_logps=torch.tensor([-2.0]),
    reference_rejected_logps=torch.tensor([-2.0]),
)


@pytest.mark.parametrize(
    "loss_type, label_smoothing, expected",
    [
        ("sigmoid", 0.0, math.log1p(math.exp(-1))),  # -log σ(0.5·2) = log(1 + e^-1) = 0.31326
        # 0.9 · 0.31326 + 0.1 · (-log σ(-1)) = 0.9 · 0.31326 + 0.1 · 1.31326 = 0.41326
        ("sigmoid", 0.1, 0.9 * math.log1p(math.exp(-1)) + 0.1 * math.log1p(math.exp(1))),
        ("ipo", 0.0, 1.0),  # (2 - 1/(2·0.5))² = (2 - 1)² = 1
        ("hinge", 0.0, 0.0),  # max(0, 1 - 0.5·2) = 0
    ],
)
def test_losses_hand_computed(loss_type, label_smoothing, expected):
    losses, metrics = dpo_loss(
        **PAIR, beta=0.5, loss_type=loss_type, label_smoothing=label_smoothing
    )
    torch.testing.assert_close(losses, torch.tensor([expected]))
    # rewards: β·1 = 0.5 chosen, β·(-1) = -0.5 rejected, margin 1, chosen wins
    assert metrics == {
        "rewards/chosen": 0.5,
        "rewards/rejected": -0.5,
        "rewards/margins": 1.0,
        "rewards/accuracies": 1.0,
    }


def test_sft_term_adds_per_token_nll_of_chosen():
    losses, metrics = dpo_loss(
        **PAIR, beta=0.5, sft_loss_coef=0.5, chosen_lengths=torch.tensor([4])
    )
    # NLL per token = -(-1) / 4 = 0.25; loss 0.31326 + 0.5 · 0.25 = 0.43826
    torch.testing.assert_close(losses, torch.tensor([math.log1p(math.exp(-1)) + 0.125]))
    torch.testing.assert_close(metrics["sft_loss"], torch.tensor(0.25))
    with pytest.raises(ValueError, match="chosen_lengths"):
        dpo_loss(**PAIR, sft_loss_coef=0.5)


def test_sigmoid_gradient_is_analytic():
    chosen = torch.tensor([-1.0, -4.0], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([-3.0, -2.0], dtype=torch.float64)
    ref = torch.tensor([-2.0, -2.0], dtype=torch.float64)
    losses, metrics = dpo_loss(chosen, rejected, ref, ref, beta=0.5)
    losses.sum().backward()
    # h = (2, -2): d/d log π_c of -log σ(β h) = -β σ(-β h) = (-0.5 σ(-1), -0.5 σ(1))
    expected = -0.5 * torch.sigmoid(torch.tensor([-1.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(chosen.grad, expected)
    assert metrics["rewards/accuracies"] == 0.5  # one pair of two ranks chosen higher


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "hinge"])
def test_gradcheck_float64(loss_type):
    g = torch.Generator().manual_seed(0)
    logps = [torch.randn(4, generator=g, dtype=torch.float64) for _ in range(4)]
    logps[0].requires_grad_(True)
    logps[1].requires_grad_(True)

    def fn(c, r):
        kwargs = dict(beta=0.3, loss_type=loss_type, label_smoothing=0.1)
        return dpo_loss(c, r, logps[2], logps[3], **kwargs)[0]

    assert torch.autograd.gradcheck(fn, (logps[0], logps[1]))


@pytest.mark.parametrize("seed", range(3))
def test_sigmoid_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    pc, pr, rc, rr = torch.randn(4, 6, generator=g, dtype=torch.float64) * 5
    losses, _ = dpo_loss(pc, pr, rc, rr, beta=0.2, label_smoothing=0.2)
    for i in range(6):
        h = (pc[i] - pr[i]) - (rc[i] - rr[i])
        expected = -0.8 * F.logsigmoid(0.2 * h) - 0.2 * F.logsigmoid(-0.2 * h)
        torch.testing.assert_close(losses[i], expected)


def test_extreme_margins_stay_finite():
    big = torch.tensor([1e4, -1e4])
    losses, _ = dpo_loss(big, -big, torch.zeros(2), torch.zeros(2), beta=1.0)
    assert torch.isfinite(losses).all()


def test_dpo_mini_batches_leave_no_rank_without_a_pair():
    from rl_core.recipes.dpo import mini_batches

    assert mini_batches(8, 4, 2) == [(0, 4), (4, 8)]
    # 9 pairs in fours over 2 ranks: the last mini-batch (1 pair) joins the one before
    assert mini_batches(9, 4, 2) == [(0, 4), (4, 9)]
    assert mini_batches(10, 4, 2) == [(0, 4), (4, 8), (8, 10)]
    assert mini_batches(1, 4, 1) == [(0, 1)]
