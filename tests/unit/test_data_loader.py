"""The resumable loader: exact resume, deterministic shuffling, epochs and batch edges."""

import json

import pytest

from rl_core.data import DataError, ResumableLoader, epoch_order

ITEMS = list(range(10))


def make(**kw) -> ResumableLoader:
    kw = {"batch_size": 3, "epochs": 3, "seed": 7} | kw
    return ResumableLoader(ITEMS, **kw)


@pytest.mark.parametrize("consumed", [0, 1, 2, 3, 4, 8, 9])
@pytest.mark.parametrize("drop_last", [True, False])
def test_resume_gives_exactly_the_rest_of_an_uninterrupted_run(consumed, drop_last):
    full = list(make(drop_last=drop_last))
    first = make(drop_last=drop_last)
    head = [next(first) for _ in range(consumed)]
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
    resumed = make(drop_last=drop_last, seed=999)  # the saved seed wins
    resumed.load_state_dict(state)
    assert head + list(resumed) == full


def test_state_dict_is_the_cursor():
    loader = make()
    next(loader)
    assert loader.state_dict() == {
        "epoch": 0,
        "position": 3,
        "seed": 7,
        "shuffle": True,
        "num_items": 10,
    }
    for _ in range(2):
        next(loader)  # 9 items handed out, 1 left < batch: the epoch ends
    assert (loader.epoch, loader.position) == (1, 0)


def test_each_epoch_is_a_new_permutation_of_every_item_with_the_tail_dropped():
    loader = make()
    batches = list(loader)
    assert len(batches) == len(loader) == loader.total_steps == 9
    assert all(len(b) == 3 for b in batches)
    epochs = [sum(batches[i : i + 3], []) for i in (0, 3, 6)]
    for epoch, items in enumerate(epochs):
        assert items == epoch_order(10, 7, epoch)[:9]
    assert len({tuple(items) for items in epochs}) == 3
    assert list(loader) == []  # exhausted


def test_keeping_the_last_partial_batch():
    batches = list(make(drop_last=False, epochs=1))
    assert [len(b) for b in batches] == [3, 3, 3, 1]
    assert sorted(sum(batches, [])) == ITEMS


def test_shuffle_is_deterministic_and_depends_on_the_seed():
    assert list(make()) == list(make())
    assert list(make()) != list(make(seed=8))
    assert epoch_order(1000, 0, 0) != epoch_order(1000, 1, 0)


def test_without_shuffle_the_order_is_the_file_order():
    assert list(make(shuffle=False, epochs=1, drop_last=False)) == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7, 8],
        [9],
    ]


def test_endless_loader_keeps_going():
    loader = make(epochs=None)
    batches = [next(loader) for _ in range(30)]
    assert loader.epoch == 10 and loader.total_steps is None
    assert batches[:9] == list(make())
    with pytest.raises(TypeError):
        len(loader)


def test_resume_refuses_a_dataset_of_another_size():
    state = make().state_dict()
    with pytest.raises(DataError, match="saved over 10 records, this dataset has 11"):
        ResumableLoader(list(range(11)), batch_size=3).load_state_dict(state)
    with pytest.raises(DataError, match="lacks position"):
        make().load_state_dict({"epoch": 0, "seed": 1})


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"batch_size": 0}, "batch_size must be positive"),
        ({"batch_size": 11}, "batch_size 11 is larger than the 10 records"),
        ({"epochs": 0}, "epochs must be positive or None"),
    ],
)
def test_bad_arguments(kw, message):
    with pytest.raises(DataError, match=message):
        make(**kw)
