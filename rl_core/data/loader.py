"""Batches of records for E epochs in a seeded order, with a cursor that resumes exactly.

    loader = ResumableLoader(records, batch_size=4, epochs=2, seed=1234)
    for batch in loader:            # lists of 4 records
        ...
        checkpoint["data"] = loader.state_dict()   # {"epoch", "position", "seed", ...}
    # later, in a fresh process:
    loader = ResumableLoader(records, batch_size=4, epochs=2, seed=1234)
    loader.load_state_dict(checkpoint["data"])      # continues with the next unseen batch

Each epoch's order is a permutation drawn from a generator seeded with (seed, epoch), so the
cursor is only (epoch, position): nothing has to be replayed to resume.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from rl_core.data.datasets import DataError

T = TypeVar("T")


def epoch_order(size: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The order of item indices in one epoch: a permutation seeded by (seed, epoch)."""
    order = list(range(size))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


class ResumableLoader(Generic[T]):
    """Batches of `batch_size` items, epoch after epoch (`epochs: None` never ends).

    `drop_last` (the default, as in training) skips an epoch's last incomplete batch; without it
    the epoch ends with a shorter batch. The loader is its own iterator: iterating again after
    `load_state_dict` continues from the restored cursor.
    """

    def __init__(
        self,
        items: Sequence[T],
        batch_size: int,
        *,
        epochs: int | None = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ):
        if batch_size <= 0:
            raise DataError(f"batch_size must be positive, got {batch_size}")
        if epochs is not None and epochs <= 0:
            raise DataError(f"epochs must be positive or None, got {epochs}")
        if drop_last and len(items) < batch_size:
            raise DataError(
                f"batch_size {batch_size} is larger than the {len(items)} records: "
                "lower the batch size or add records"
            )
        self.items = items
        self.batch_size = batch_size
        self.epochs = epochs
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0  # items of the current epoch's order already handed out
        self._order: tuple[int, list[int]] | None = None  # (epoch, order) cache

    @property
    def steps_per_epoch(self) -> int:
        full, rest = divmod(len(self.items), self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    @property
    def total_steps(self) -> int | None:
        """Batches over all epochs; None when endless."""
        return None if self.epochs is None else self.steps_per_epoch * self.epochs

    def __len__(self) -> int:
        if self.epochs is None:
            raise TypeError("an endless loader (epochs=None) has no length")
        return self.steps_per_epoch * self.epochs

    @property
    def exhausted(self) -> bool:
        return self.epochs is not None and self.epoch >= self.epochs

    def __iter__(self) -> Iterator[list[T]]:
        return self

    def __next__(self) -> list[T]:
        if self.exhausted:
            raise StopIteration
        order = self._epoch_order()
        end = min(self.position + self.batch_size, len(order))
        batch = [self.items[i] for i in order[self.position : end]]
        self.position = end
        left = len(order) - end
        if left == 0 or (self.drop_last and left < self.batch_size):
            self.epoch, self.position = self.epoch + 1, 0
        return batch

    def _epoch_order(self) -> list[int]:
        if self._order is None or self._order[0] != self.epoch:
            self._order = (
                self.epoch,
                epoch_order(len(self.items), self.seed, self.epoch, self.shuffle),
            )
        return self._order[1]

    def state_dict(self) -> dict[str, Any]:
        """The cursor as a JSON-able dict."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_items": len(self.items),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a `state_dict`; the dataset must have the same number of items."""
        missing = {"epoch", "position", "seed"} - set(state)
        if missing:
            raise DataError(f"loader state lacks {', '.join(sorted(missing))}: got {dict(state)}")
        size = state.get("num_items", len(self.items))
        if size != len(self.items):
            raise DataError(
                f"loader state was saved over {size} records, this dataset has {len(self.items)}: "
                "resume with the same data"
            )
        if not 0 <= state["position"] <= len(self.items):
            raise DataError(f"loader state position {state['position']} is out of range")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self.seed = int(state["seed"])
        self.shuffle = bool(state.get("shuffle", self.shuffle))
        self._order = None
