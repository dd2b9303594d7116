"""DAPO soft overlong punishment and the dynamic-sampling group filter."""

import pytest
import torch

from rl_core.algos import filter_groups, overlong_penalty


def test_overlong_penalty_hand_computed():
    lengths = torch.tensor([10, 16, 17, 18, 20, 25])
    # max 20, buffer 4: free up to 16, then -(len - 16)/4: 17 -> -0.25, 18 -> -0.5, 20 -> -1
    got = overlong_penalty(lengths, max_len=20, buffer_len=4, penalty_factor=1.0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    # the penalty factor scales it: 18 -> -0.5 · 2 = -1
    assert overlong_penalty(torch.tensor([18]), 20, 4, penalty_factor=2.0).item() == -1.0


@pytest.mark.parametrize("max_len, buffer_len", [(20, 0), (20, 21)])
def test_overlong_penalty_rejects_bad_buffer(max_len, buffer_len):
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(torch.tensor([5]), max_len, buffer_len)


def test_filter_groups_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 2.0, 2.0, 3.0])
    index = ["a", "a", "b", "b", "c", "d", "d", "d"]
    keep, n_kept = filter_groups(rewards, index)
    # a: (1, 0) mixed -> keep; b: (1, 1) equal -> drop; c alone -> drop; d: (2, 2, 3) -> keep
    assert keep.tolist() == [True, True, False, False, False, True, True, True]
    assert n_kept == 2


@pytest.mark.parametrize("seed", range(5))
def test_filter_groups_matches_loop(seed):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randint(0, 2, (16,), generator=g).float()  # binary rewards: many ties
    index = torch.randint(0, 6, (16,), generator=g)
    keep, n_kept = filter_groups(rewards, index)
    groups = {}
    for r, i in zip(rewards.tolist(), index.tolist()):
        groups.setdefault(i, []).append(r)
    informative = {i for i, rs in groups.items() if len(set(rs)) > 1}
    assert keep.tolist() == [i in informative for i in index.tolist()]
    assert n_kept == len(informative)


def test_filter_groups_empty_batch():
    keep, n_kept = filter_groups(torch.zeros(0), torch.zeros(0, dtype=torch.long))
    assert keep.shape == (0,) and n_kept == 0
