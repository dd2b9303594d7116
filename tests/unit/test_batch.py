"""The batch container: one row count, row selection, data-parallel shards, concat with padding."""

from __future__ import annotations

import pickle

import pytest
import torch

from rl_core.data.batch import Batch, left_pad, shard_bounds
from rl_core.data.prompts import response_batch


def sample(rows: int = 5, width: int = 3) -> Batch:
    return Batch({"ids": torch.arange(rows * width).view(rows, width),
                  "score": torch.arange(rows, dtype=torch.float32),
                  "truth": [f"t{i}" for i in range(rows)]})


def test_columns_agree_on_one_row_count():
    batch = sample()
    assert len(batch) == 5 and batch.keys() == ["ids", "score", "truth"]
    assert batch.truth == batch["truth"] == ["t0", "t1", "t2", "t3", "t4"]
    with pytest.raises(ValueError, match="'bad' has 4 rows, the batch 5"):
        batch["bad"] = torch.zeros(4)
    with pytest.raises(AttributeError, match="no column 'missing'; it has ids, score, truth"):
        batch.missing


def test_take_by_index_mask_and_slice_keeps_every_column_aligned():
    batch = sample()
    by_index = batch.take(torch.tensor([4, 0]))
    assert by_index.score.tolist() == [4.0, 0.0] and by_index.truth == ["t4", "t0"]
    assert by_index.ids.tolist() == [[12, 13, 14], [0, 1, 2]]
    by_mask = batch.take(torch.tensor([True, False, True, False, False]))
    assert by_mask.truth == ["t0", "t2"]
    assert batch.slice(1, 3).truth == ["t1", "t2"] and len(batch.chunk(2)) == 3


def test_shards_are_contiguous_and_the_first_ranks_take_the_remainder():
    # 5 rows over 2 ranks: 3 + 2 (shard_bounds: the first rank takes the extra row)
    assert shard_bounds(5, 2) == [(0, 3), (3, 5)]
    assert [s.truth for s in sample().split(2)] == [["t0", "t1", "t2"], ["t3", "t4"]]
    # more ranks than rows: the last ranks get none
    assert [len(s) for s in sample(2).split(3)] == [1, 1, 0]


def test_groups_stay_on_one_rank():
    pairs = sample(6)  # three pairs (0,1) (2,3) (4,5) over two ranks: 2 pairs + 1 pair
    assert [s.truth for s in pairs.split(2, group=2)] == [["t0", "t1", "t2", "t3"], ["t4", "t5"]]
    with pytest.raises(ValueError, match="5 rows do not form groups of 2"):
        sample(5).split(2, group=2)


def test_concat_pads_prompts_on_the_left_and_the_rest_on_the_right():
    a = Batch({"prompt_ids": torch.tensor([[7]]), "response_ids": torch.tensor([[1, 2, 3]]),
               "truth": ["a"]})
    b = Batch({"prompt_ids": torch.tensor([[8, 9]]), "response_ids": torch.tensor([[4]]),
               "truth": ["b"]})
    joined = Batch.concat([a, b], pad_value=-1)
    assert joined.prompt_ids.tolist() == [[-1, 7], [8, 9]]
    assert joined.response_ids.tolist() == [[1, 2, 3], [4, -1, -1]]
    assert joined.truth == ["a", "b"]
    assert len(Batch.concat([])) == 0


def test_update_takes_a_batch_or_a_mapping():
    batch = sample(2)
    batch.update(Batch({"extra": [1, 2]})).update({"more": torch.zeros(2)})
    assert batch.keys() == ["ids", "score", "truth", "extra", "more"]
    assert dict(batch.select(["extra"]).items()) == {"extra": [1, 2]}


def test_a_batch_survives_pickling_as_ray_sends_it():
    batch = sample()
    copy = pickle.loads(pickle.dumps(batch))
    assert copy.keys() == batch.keys() and torch.equal(copy.ids, batch.ids)


def test_known_responses_form_a_rollout_batch_with_its_training_sequences():
    batch = response_batch([[5, 6], [7]], [[1], [2, 3]], pad=0)
    assert batch.prompt_ids.tolist() == [[5, 6], [0, 7]]
    assert batch.response_ids.tolist() == [[1, 0], [2, 3]]
    assert batch.response_lengths.tolist() == [1, 2]
    input_ids, attention_mask, position_ids = batch.to_sequences()
    assert input_ids.tolist() == [[5, 6, 1, 0], [0, 7, 2, 3]]
    assert attention_mask.tolist() == [[1, 1, 1, 0], [0, 1, 1, 1]]
    # prompt positions count real tokens from 0, then continue through the response
    assert position_ids.tolist() == [[0, 1, 2, 3], [0, 0, 1, 2]]
    assert batch.with_sequences().keys() == ["input_ids", "attention_mask", "position_ids",
                                             "response_mask"]


def test_left_pad_refuses_what_cannot_be_generated_from():
    with pytest.raises(ValueError, match="no prompts"):
        left_pad([], 0)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        left_pad([[1], []], 0)
