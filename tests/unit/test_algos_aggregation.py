"""Loss aggregation modes and masked reductions: hand-computed cases and loop references."""

import math
import statistics

import pytest
import torch

from rl_core.algos import agg_loss, masked_mean, masked_var, masked_whiten
from rl_core.algos.masked import group_ids, group_stats

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    "mode, norm_len, expected",
    [
        ("token-mean", None, 2.5),  # (1 + 2 + 3 + 4) / 4 tokens
        ("seq-mean-token-mean", None, 3.0),  # (6/3 + 4/1) / 2 = (2 + 4) / 2
        ("seq-mean-token-sum", None, 5.0),  # (6 + 4) / 2
        ("seq-mean-token-sum-norm", None, 5 / 3),  # (6/3 + 4/3) / 2, horizon T = 3
        ("seq-mean-token-sum-norm", 4, 1.25),  # (6/4 + 4/4) / 2
    ],
)
def test_modes_hand_computed(mode, norm_len, expected):
    torch.testing.assert_close(agg_loss(LOSS, MASK, mode, norm_len), torch.tensor(expected))


def slow_agg(loss, mask, mode, norm_len=None):
    rows = [
        [v for v, m in zip(lrow, mrow) if m] for lrow, mrow in zip(loss.tolist(), mask.tolist())
    ]
    rows = [r for r in rows if r]  # sequences without tokens do not count
    if not rows:
        return 0.0
    horizon = norm_len or loss.shape[-1]
    per_seq = {
        "token-mean": None,
        "seq-mean-token-mean": [sum(r) / len(r) for r in rows],
        "seq-mean-token-sum": [sum(r) for r in rows],
        "seq-mean-token-sum-norm": [sum(r) / horizon for r in rows],
    }[mode]
    if per_seq is None:
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    return sum(per_seq) / len(per_seq)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_modes_match_loop(seed, mode):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(6, 9, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, 10, (6,), generator=g)
    mask = (torch.arange(9) < lengths[:, None]).double()
    mask[2] = 0  # an empty row
    norm_len = 12 if seed % 2 else None
    expected = slow_agg(loss, mask, mode, norm_len)
    torch.testing.assert_close(agg_loss(loss, mask, mode, norm_len).item(), expected)


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_empty_mask_gives_zero_loss_and_zero_gradient(mode):
    loss = torch.randn(2, 3, requires_grad=True)
    out = agg_loss(loss, torch.zeros(2, 3), mode)
    out.backward()
    assert out == 0 and torch.equal(loss.grad, torch.zeros(2, 3))


def test_bad_norm_len_and_mode():
    with pytest.raises(ValueError, match="norm_len"):
        agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", 0)
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'") as caught:
        agg_loss(LOSS, MASK, "mean")
    assert "seq-mean-token-sum-norm, token-mean" in str(caught.value)


# ----------------------------------------------------------------- masked helpers


def test_masked_mean_var_whiten_hand_computed():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    m = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # mean (1 + 2 + 3) / 3 = 2; unbiased var (1 + 0 + 1) / 2 = 1; biased 2/3
    assert masked_mean(x, m) == 2
    torch.testing.assert_close(masked_var(x, m), torch.tensor(1.0))
    torch.testing.assert_close(masked_var(x, m, unbiased=False), torch.tensor(2 / 3))
    # whitened (x - 2) / sqrt(1 + 1e-8): (-1, 0, 1) on the valid elements
    torch.testing.assert_close(masked_whiten(x, m)[:3], torch.tensor([-1.0, 0.0, 1.0]))
    unshifted = masked_whiten(x, m, shift_mean=False)[:3]
    torch.testing.assert_close(unshifted, torch.tensor([1.0, 2.0, 3.0]))


def test_masked_helpers_on_one_and_no_elements_stay_finite():
    x = torch.tensor([5.0, 7.0])
    for m in (torch.tensor([1.0, 0.0]), torch.zeros(2)):
        assert torch.isfinite(masked_var(x, m)) and torch.isfinite(masked_whiten(x, m)).all()
    assert masked_whiten(x, torch.tensor([1.0, 0.0]))[0] == 0  # a single element whitens to 0


@pytest.mark.parametrize("seed", range(3))
def test_group_stats_match_loop(seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(10, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 4, (10,), generator=g).tolist() + ["solo"]
    scores = torch.cat([scores, torch.tensor([3.0], dtype=torch.float64)])
    count, mean, std = group_stats(scores, group_ids(labels))
    for i, label in enumerate(labels):
        vals = [s for s, lab in zip(scores.tolist(), labels) if lab == label]
        assert count[i] == len(vals)
        assert math.isclose(mean[i].item(), statistics.fmean(vals))
        expected_std = statistics.stdev(vals) if len(vals) > 1 else 0.0
        assert math.isclose(std[i].item(), expected_std, abs_tol=1e-12)


def test_group_ids_are_dense_in_first_seen_order():
    assert group_ids(["b", "a", "b", "c"]).tolist() == [0, 1, 0, 2]
    assert group_ids(torch.tensor([10, 3, 10])).tolist() == [1, 0, 1]
