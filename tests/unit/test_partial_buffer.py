"""The partial-rollout buffer: pieces appended, ends by eos, length and age, fewer new prompts
while samples wait, complete groups in draw order exactly once, a rollout batch, checkpoints."""

import random

import pytest
import torch

from rl_core.data.batch import ROLLOUT_COLUMNS
from rl_core.data.loader import ResumableLoader
from rl_core.data.partial import (
    CUT,
    RUNNING,
    STOPPED,
    PartialRollouts,
    StepCounts,
    contexts,
    rollout_batch,
)
from rl_core.data.prompts import response_batch
from rl_core.errors import InputError

PAD = 0


def pieces(tokens: list[list[int]], stopped: list[bool]):
    """The rollout batch of one call with n = 1: row i's piece `tokens[i]`, its log-probs
    -0.1 × token, `finished` as given."""
    batch = response_batch([[1]] * len(tokens), tokens, PAD)
    batch["logprobs"] = -0.1 * batch.response_ids.float() * batch.response_mask
    batch["finished"] = torch.tensor(stopped)
    return batch


def buffer_with(groups: int, n: int = 2, max_new_tokens: int = 6, split: int = 3, **kw):
    buffer = PartialRollouts(n, max_new_tokens, split, **kw)
    buffer.add(range(groups), [[100 + g, 7] for g in range(groups)])
    return buffer


def test_a_piece_is_appended_and_ends_the_sample_by_eos_or_length():
    buffer = buffer_with(1, n=3)  # chunk 2 of 6 tokens
    rows = buffer.running()
    assert contexts(rows) == [[100, 7]] * 3
    assert buffer.record(rows, pieces([[5, 9], [4], [6, 6]], [False, True, False]), 0) == (1, 0)
    first, second, third = buffer.groups[0].samples
    assert (first.tokens, first.status, second.status) == ([5, 9], RUNNING, STOPPED)
    assert first.logprobs == pytest.approx([-0.5, -0.9])
    rows = buffer.running()  # the two still running, their tokens so far after the prompt
    assert contexts(rows) == [[100, 7, 5, 9], [100, 7, 6, 6]]
    buffer.record(rows, pieces([[3, 3], [8, 2]], [False, True]), 1)
    # 2 + 2 of 6 tokens: still running; 4 tokens then eos: stopped
    assert (first.status, third.status, third.tokens) == (RUNNING, STOPPED, [6, 6, 8, 2])
    assert buffer.record(buffer.running(), pieces([[1, 1]], [False]), 1) == (1, 1)
    assert (first.tokens, first.status, first.pieces) == ([5, 9, 3, 3, 1, 1], CUT, 3)
    assert (first.first_version, first.last_version, first.age) == (0, 1, 2)
    assert buffer.ready == 1 and buffer.pending == 0


def test_a_piece_longer_than_the_chunk_or_a_row_count_mismatch_is_refused():
    buffer = buffer_with(1)
    with pytest.raises(ValueError, match="longer than the chunk"):
        buffer.record(buffer.running(), pieces([[1, 2, 3], [1]], [False, False]), 0)
    with pytest.raises(ValueError, match="1 rows for 2 samples"):
        buffer.record(buffer.running(), pieces([[1]], [False]), 0)


def test_fewer_new_prompts_are_drawn_while_samples_wait():
    buffer = buffer_with(2, n=4)
    assert buffer.wanted(2) == 0  # 8 samples waiting: a full call of 2 prompts x 4
    buffer.record(buffer.running(), pieces([[1]] * 8, [True] * 3 + [False] * 5), 0)
    # 5 waiting: (8 - 5) // 4 = 0 new prompts; with 4 wanted groups (16 rows): (16 - 5) // 4 = 2
    assert (buffer.wanted(2), buffer.wanted(4)) == (0, 2)
    buffer.record(buffer.running(), pieces([[1]] * 5, [True] * 5), 0)
    assert buffer.wanted(2) == 2


def test_draw_keeps_the_rest_of_a_loader_batch_for_the_next_call():
    loader = ResumableLoader(list(range(8)), 4, epochs=1, shuffle=False)
    buffer = PartialRollouts(2, 4, 2)
    assert buffer.draw(3, loader) == [0, 1, 2] and buffer.queue == [3]
    assert buffer.draw(2, loader) == [3, 4] and buffer.queue == [5, 6, 7]
    assert buffer.draw(4, loader) == [5, 6, 7]  # the loader ran out
    assert buffer.draw(0, loader) == []


def test_the_age_limit_cuts_a_sample_whose_next_piece_comes_from_a_later_policy():
    buffer = buffer_with(1, n=1, max_new_tokens=8, split=4, max_age=2)
    buffer.record(buffer.running(), pieces([[1, 1]], [False]), 3)
    assert buffer.expire(3) == 0 and buffer.expire(4) == 0  # versions 3..4: age 2
    buffer.record(buffer.running(), pieces([[2, 2]], [False]), 4)
    assert buffer.expire(5) == 1  # a piece of version 5 would make it 3 versions old
    sample = buffer.groups[0].samples[0]
    assert (sample.status, sample.tokens, sample.age) == (CUT, [1, 1, 2, 2], 2)
    assert buffer.ready == 1


def test_the_default_age_limit_is_the_split():
    assert PartialRollouts(2, 8, 4).max_age == 4
    with pytest.raises(ValueError, match="divide"):
        PartialRollouts(2, 10, 4)


def test_complete_groups_come_out_in_draw_order_and_only_once():
    buffer = buffer_with(3)
    # group 0 keeps a sample running; groups 1 and 2 complete
    buffer.record(buffer.running(), pieces([[1, 2], [3], [4], [5], [6], [7]],
                                           [False, True, True, True, True, True]), 0)
    assert buffer.ready == 2
    taken = buffer.pop(1)
    assert [g.item for g in taken] == [1]
    assert [g.item for g in buffer.groups] == [0, 2]
    with pytest.raises(ValueError, match="1 complete groups, 2 wanted"):
        buffer.pop(2)
    assert [g.item for g in buffer.pop(1)] == [2]


def test_a_simulated_run_trains_every_sample_of_every_group_exactly_once():
    """Calls with random lengths until each step has 3 complete groups: every drawn group trains
    once with all its n samples, the groups of a step in draw order, each response the pieces it
    was given in order."""
    rng = random.Random(0)
    n, groups, loader = 3, 3, ResumableLoader(list(range(200)), 3, epochs=1, seed=1)
    buffer = PartialRollouts(n, max_new_tokens=8, split=4, max_age=3)
    given: dict[tuple[int, int], list[int]] = {}  # (item, sample index) -> tokens handed out
    trained: list[tuple[int, int]] = []
    drawn: list[int] = []
    for version in range(8):
        while True:
            buffer.expire(version)
            if buffer.ready >= groups:
                break
            items = buffer.draw(buffer.wanted(groups), loader)
            drawn += items
            buffer.add(items, [[i] for i in items])
            rows = buffer.running()
            # as an engine makes them: a piece shorter than the chunk (2) ends on eos
            stopped = [rng.random() < 0.4 for _ in rows]
            made = [[rng.randrange(1, 50) for _ in range(rng.randint(1, 2) if stop else 2)]
                    for stop in stopped]
            for (group, sample), piece in zip(rows, made):
                given.setdefault((group.item, group.samples.index(sample)), []).extend(piece)
            buffer.record(rows, pieces(made, stopped), version)
        step = buffer.pop(groups)
        assert [drawn.index(g.item) for g in step] == sorted(drawn.index(g.item) for g in step)
        for group in step:
            assert len(group.samples) == n and group.complete
            for index, sample in enumerate(group.samples):
                assert sample.tokens == given[(group.item, index)]
                assert sample.age <= 3 and len(sample.tokens) <= 8
                trained.append((group.item, index))
    waiting = [(g.item, i) for g in buffer.groups for i in range(n)]
    assert len(trained) == len(set(trained)) == 8 * groups * n
    assert sorted(trained + waiting) == sorted((item, i) for item in drawn for i in range(n))


def test_the_trained_groups_form_one_rollout_batch():
    buffer = buffer_with(2)
    buffer.groups[1].prompt = [9]  # a shorter prompt: left-padded
    buffer.record(buffer.running(), pieces([[5, 6], [4], [3, 3], [2]], [False, True, False, True]),
                  0)
    buffer.record(buffer.running(), pieces([[7], [8]], [True, True]), 1)
    batch = rollout_batch(buffer.pop(2), PAD)
    assert set(ROLLOUT_COLUMNS) <= set(batch.keys())
    assert batch.prompt_ids.tolist() == [[100, 7], [100, 7], [PAD, 9], [PAD, 9]]
    assert batch.prompt_mask.tolist() == [[1, 1], [1, 1], [0, 1], [0, 1]]
    assert batch.response_ids.tolist() == [[5, 6, 7], [4, PAD, PAD], [3, 3, 8], [2, PAD, PAD]]
    assert batch.response_mask.tolist() == [[1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 0, 0]]
    assert batch.logprobs[0].tolist() == pytest.approx([-0.5, -0.6, -0.7])
    assert batch.prompt_index.tolist() == [0, 0, 1, 1]
    assert batch.response_lengths.tolist() == [3, 1, 3, 1]
    assert batch.finished.tolist() == [True] * 4
    assert batch.weight_version.tolist() == [1, 0, 1, 0]


def test_the_step_metrics():
    buffer = buffer_with(1, n=2, max_new_tokens=4, split=2)
    buffer.record(buffer.running(), pieces([[1, 1], [2]], [False, True]), 0)
    buffer.record(buffer.running(), pieces([[3, 3]], [False]), 1)
    counts = StepCounts(calls=2, rows=3, ended=2, cut=1, expired=1)
    metrics = counts.metrics(buffer.pop(1), pending=5)
    assert metrics == {"rollout/partial/calls": 2.0, "rollout/partial/finished_frac": 2 / 3,
                       "rollout/partial/truncated_frac": 2 / 3,  # (1 cut + 1 expired) of 3 ended
                       "rollout/partial/mean_age": 1.5,  # ages 2 (versions 0, 1) and 1
                       "rollout/partial/max_age": 2.0, "rollout/partial/pending": 5.0}


def test_the_state_resumes_the_same_calls(tmp_path):
    buffer = buffer_with(2, max_age=2)
    buffer.queue = [5, 6]
    buffer.record(buffer.running(), pieces([[1, 2], [3], [4, 4], [5, 5]],
                                           [False, True, False, False]), 0)
    torch.save(buffer.state_dict(), tmp_path / "state.pt")
    again = PartialRollouts(2, 6, 3, max_age=2)
    again.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=False))
    assert again.queue == [5, 6]
    assert contexts(again.running()) == contexts(buffer.running())
    assert again.state_dict() == buffer.state_dict()
    with pytest.raises(InputError, match="rollout.partial_rollout_max_split: .* made with 3"):
        PartialRollouts(2, 6, 2).load_state_dict(buffer.state_dict())
