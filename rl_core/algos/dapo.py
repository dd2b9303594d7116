"""DAPO reward shaping and sampling: soft overlong punishment and the dynamic-sampling filter."""

from __future__ import annotations

import torch

from rl_core.algos.advantages import Index
from rl_core.algos.masked import group_ids


def overlong_penalty(
    response_lengths: torch.Tensor, max_len: int, buffer_len: int, penalty_factor: float = 1.0
) -> torch.Tensor:
    """Soft overlong punishment (DAPO eq. 13), added to the reward: lengths (N,) -> (N,) float.

    0 up to max_len - buffer_len, then falling linearly to -penalty_factor at max_len, and
    -penalty_factor beyond.
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"need 0 < buffer_len <= max_len, got {buffer_len} and {max_len}")
    excess = response_lengths.float() - (max_len - buffer_len)  # (N,)
    return -penalty_factor * (excess / buffer_len).clamp(0.0, 1.0)


def filter_groups(rewards: torch.Tensor, index: Index) -> tuple[torch.Tensor, int]:
    """DAPO dynamic sampling: keep responses of groups whose rewards are not all equal.

    rewards (N,) (sequence scores), index (N,) group labels -> keep mask (N,) bool and the
    number of kept groups. A group of one has all-equal rewards and is dropped (it carries no
    group-relative signal); verl keeps such groups.
    """
    gid = group_ids(index, rewards.device)
    n_groups = int(gid.max()) + 1 if gid.numel() else 0
    big = torch.full((n_groups,), float("inf"), dtype=rewards.dtype, device=rewards.device)
    group_min = big.scatter_reduce(0, gid, rewards, reduce="amin")  # (G,)
    group_max = (-big).scatter_reduce(0, gid, rewards, reduce="amax")  # (G,)
    keep_group = group_max > group_min  # (G,)
    return keep_group[gid], int(keep_group.sum())
