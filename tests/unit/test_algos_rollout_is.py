"""Truncated importance weights against the rollout engine's log-probs, and their metrics."""

import math
from typing import get_args

import pytest
import torch

from rl_core import spec
from rl_core.algos import ROLLOUT_IS_MODES, UnknownNameError, rollout_is_weights

# Two responses of up to 3 tokens; the first has one padding token holding arbitrary values.
OLD = torch.tensor([[-1.0, -2.0, 0.0], [-0.1, -0.2, -0.3]])
ROLLOUT = torch.tensor([[-1.5, -1.0, -7.0], [-0.9, -0.8, -0.3]])
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]])
# old - rollout on response tokens: [[0.5, -1.0], [0.8, 0.6, 0.0]]
CAP = 2.0
TOL = {"rtol": 0, "atol": 1e-5}


def close(actual, expected):
    torch.testing.assert_close(actual, expected, **TOL)


def test_token_mode_hand_computed():
    weights, m = rollout_is_weights(OLD, ROLLOUT, MASK, "token", CAP)
    # e^0.5 = 1.648721, e^-1 = 0.367879; e^0.8 = 2.225541 -> cap 2, e^0.6 = 1.822119, e^0 = 1
    expected = torch.tensor([[1.648721, 0.367879, 0.0], [2.0, 1.822119, 1.0]])
    close(weights, expected)
    assert weights.dtype == torch.float32
    close(m["rollout/logprob_diff/mean"], 0.58)  # (0.5 + 1.0 + 0.8 + 0.6 + 0) / 5
    close(m["rollout/logprob_diff/max"], 1.0)
    close(m["rollout/is_weight/mean"], 1.367744)  # 6.838719 / 5
    close(m["rollout/is_weight/min"], 0.367879)
    close(m["rollout/is_weight/max"], 2.0)
    close(m["rollout/is_weight/truncated_frac"], 0.2)  # 1 of 5 response tokens
    close(m["rollout/is_weight/ess"], 0.837108)  # 6.838719² / (5 · 11.173734)
    close(m["rollout/kl/k1"], -0.18)  # mean(rollout - old) = (-0.5 + 1 - 0.8 - 0.6 + 0) / 5
    close(m["rollout/kl/k3"], 0.232852)  # mean(e^d - d - 1)
    assert all(isinstance(v, float) for v in m.values())


def test_sequence_mode_hand_computed():
    weights, m = rollout_is_weights(OLD, ROLLOUT, MASK, "sequence", CAP)
    # row 0: e^(0.5 - 1.0) = e^-0.5 = 0.606531; row 1: e^(0.8 + 0.6 + 0) = e^1.4 = 4.0552 -> 2
    expected = torch.tensor([[0.606531, 0.606531, 0.0], [2.0, 2.0, 2.0]])
    close(weights, expected)
    close(m["rollout/is_weight/mean"], 1.442612)  # per token: (2 · 0.606531 + 3 · 2) / 5
    close(m["rollout/is_weight/truncated_frac"], 0.5)  # 1 of 2 rows
    close(m["rollout/is_weight/ess"], 0.777723)  # over rows: 2.606531² / (2 · 4.367879)
    close(m["rollout/logprob_diff/mean"], 0.58)  # the same token diffs as in token mode
    close(m["rollout/logprob_diff/max"], 1.0)


def test_two_token_example():
    old, rollout = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    mask = torch.ones(1, 2)
    token, _ = rollout_is_weights(old, rollout, mask, "token", 5.0)
    close(token, torch.tensor([[math.exp(0.5), math.exp(-1.0)]]))  # 1.648721, 0.367879
    sequence, m = rollout_is_weights(old, rollout, mask, "sequence", 5.0)
    close(sequence, torch.full((1, 2), math.exp(-0.5)))  # e^(0.5 - 1) = 0.606531
    close(m["rollout/is_weight/ess"], 1.0)  # one sequence


def test_truncation_at_the_cap():
    old = torch.tensor([[math.log(3.0), math.log(2.0), 0.0]], dtype=torch.float64)
    rollout = torch.zeros(1, 3, dtype=torch.float64)
    weights, m = rollout_is_weights(old, rollout, torch.ones(1, 3), "token", 2.0)
    close(weights, torch.tensor([[2.0, 2.0, 1.0]]))  # ratios 3 -> 2, 2 stays, 1 stays
    close(m["rollout/is_weight/truncated_frac"], 1 / 3)  # a ratio equal to the cap is not cut
    weights, m = rollout_is_weights(old, rollout, torch.ones(1, 3), "token", 1.0)
    close(weights, torch.ones(1, 3))  # cap 1: no token is up-weighted
    close(m["rollout/is_weight/truncated_frac"], 2 / 3)
    weights, _ = rollout_is_weights(old, rollout, torch.ones(1, 3), "token", math.inf)
    close(weights, torch.tensor([[3.0, 2.0, 1.0]]))  # an infinite cap is plain IS


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_padding_is_zero_and_never_read(mode):
    old = OLD.clone()
    rollout = ROLLOUT.clone()
    old[0, 2], rollout[0, 2] = float("nan"), float("-inf")  # garbage where the mask is 0
    weights, m = rollout_is_weights(old, rollout, MASK, mode, CAP)
    reference, ref_m = rollout_is_weights(OLD, ROLLOUT, MASK, mode, CAP)
    assert weights[0, 2] == 0
    torch.testing.assert_close(weights, reference)
    assert m == ref_m


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_huge_log_ratio_does_not_overflow(mode):
    old = torch.tensor([[0.0, 0.0], [-1000.0, -1000.0]])
    rollout = torch.tensor([[-1000.0, -1000.0], [0.0, 0.0]])  # log-ratios +1000 and -1000
    weights, m = rollout_is_weights(old, rollout, torch.ones(2, 2), mode, 3.0)
    close(weights, torch.tensor([[3.0, 3.0], [0.0, 0.0]]))  # e^1000 -> cap, e^-1000 -> 0
    assert all(math.isfinite(v) for v in m.values())
    close(m["rollout/logprob_diff/max"], 1000.0)
    close(m["rollout/is_weight/mean"], 1.5)
    close(m["rollout/is_weight/truncated_frac"], 0.5)


def test_off_mode_gives_ones_on_responses_and_the_diff_metrics():
    weights, m = rollout_is_weights(OLD, ROLLOUT, MASK, "off", CAP)
    close(weights, MASK.float())
    assert weights.dtype == torch.float32
    assert set(m) == {
        "rollout/logprob_diff/mean",
        "rollout/logprob_diff/max",
        "rollout/kl/k1",
        "rollout/kl/k3",
    }
    close(m["rollout/logprob_diff/mean"], 0.58)
    close(m["rollout/logprob_diff/max"], 1.0)


@pytest.mark.parametrize("mode", ROLLOUT_IS_MODES)
def test_equal_log_probs_give_unit_weights(mode):
    weights, m = rollout_is_weights(ROLLOUT, ROLLOUT, MASK, mode, CAP)
    close(weights, MASK.float())
    close(m["rollout/logprob_diff/max"], 0.0)
    close(m["rollout/kl/k3"], 0.0)


def test_weights_are_detached_and_inputs_of_any_float_dtype_work():
    old = OLD.clone().requires_grad_(True)
    weights, _ = rollout_is_weights(old, ROLLOUT, MASK, "token", CAP)
    assert not weights.requires_grad
    bf16, _ = rollout_is_weights(OLD.bfloat16(), ROLLOUT.bfloat16(), MASK.bool(), "token", CAP)
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, weights, rtol=0, atol=2e-2)


@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_empty_mask_is_finite(mode):
    weights, m = rollout_is_weights(OLD, ROLLOUT, torch.zeros(2, 3), mode, CAP)
    assert (weights == 0).all()
    assert all(v == 0.0 for v in m.values())


@pytest.mark.parametrize("cap", [0.5, 0.0, -1.0, float("nan")])
def test_cap_below_one_is_rejected(cap):
    with pytest.raises(ValueError, match=r"actor\.rollout_is_cap must be >= 1"):
        rollout_is_weights(OLD, ROLLOUT, MASK, "token", cap)


@pytest.mark.parametrize("mode", ["geometric", "Token", None])
def test_unknown_mode_lists_the_valid_ones(mode):
    with pytest.raises(UnknownNameError) as caught:
        rollout_is_weights(OLD, ROLLOUT, MASK, mode, CAP)
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, ValueError)
    assert str(caught.value) == (
        f"unknown rollout_is mode {mode!r}: choose one of off, sequence, token"
    )


def test_shape_mismatch_is_rejected():
    with pytest.raises(ValueError, match="must have one shape"):
        rollout_is_weights(OLD, ROLLOUT[:, :2], MASK, "token", CAP)


def test_modes_are_the_spec_vocabulary():
    annotation = spec.ActorConfig.model_fields["rollout_is"].annotation
    assert set(get_args(annotation)) == set(ROLLOUT_IS_MODES)
