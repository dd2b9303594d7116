"""The batch container: what flows between the controller, the data channel, the roles and engines.

    batch = Batch({"prompt_ids": ids, "response_ids": resp, "truth": ["3", "5"]})
    len(batch)                         # the row count every column agrees on
    batch["response_ids"], batch.response_ids
    shards = batch.split(world_size)   # one contiguous share per data-parallel rank
    rows = batch.take(index)           # rows by index, mask or slice
    joined = Batch.concat([a, b])      # 2-D tensors padded to the widest first
    batch.to("npu:0")

Columns are torch tensors (first dimension = rows) or lists (non-tensor data: ground truths,
texts). Splitting over data-parallel ranks is written here and only here (`shard_bounds`):
ranks get contiguous shares, the first ones one row more when the rows do not divide, and a
`group` keeps groups of adjacent rows (a DPO pair, a prompt's samples) on one rank.

On concat, 2-D tensor columns are padded to the widest part with `pad_value`, on the left for
the columns in `LEFT_PADDED` (prompts are left-padded so every response starts in the same
column) and on the right for every other one (responses).

`tensordict.TensorDict` (PyTorch's container) was weighed as the base: it holds tensors with a
shared batch dimension well, but non-tensor columns need its `NonTensorData` wrappers, it cannot
concatenate columns of different widths, and it would add a dependency the web process and Ray
workers must install; a plain mapping of columns, pickled by Ray as is, serves here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

# Columns padded on the left when batches of different widths are joined.
LEFT_PADDED = frozenset({"prompt_ids", "prompt_mask"})
# What a rollout produces, one row per sampled response (a prompt's n rows adjacent):
ROLLOUT_COLUMNS = ("prompt_ids",        # (B, P) long, left-padded
                   "prompt_mask",       # (B, P) long 0/1
                   "response_ids",      # (B, R) long, right-padded, R = longest response
                   "response_mask",     # (B, R) long 0/1, up to and including the eos token
                   "logprobs",          # (B, R) float32 under the rollout engine, 0 on padding
                   "prompt_index",      # (B,) long: the input prompt each row came from
                   "response_lengths",  # (B,) long
                   "finished")          # (B,) bool: stopped on eos (False: cut at the limit)
# What a training forward reads (`Batch.to_sequences`).
SEQUENCE_COLUMNS = ("input_ids", "attention_mask", "position_ids", "response_mask")
# A vision-language batch's images, each row's padded to the batch's largest: "pixel_values"
# (B, patches, 3·2·14·14 for Qwen2.5-VL) and "image_grid_thw" (B, images, 3), a grid of zeros
# where a row has fewer images (`image_columns`; `rl_core.models.vision.image_inputs` turns
# them into the model's inputs).
IMAGE_COLUMNS = ("pixel_values", "image_grid_thw")


def shard_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) shares of `total` items over `parts` ranks (the first take one
    more when it does not divide)."""
    base, extra = divmod(total, parts)
    bounds, start = [], 0
    for rank in range(parts):
        stop = start + base + (rank < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


class Batch:
    """Named columns over one row count."""

    __slots__ = ("columns",)

    def __init__(self, columns: Mapping[str, Any] | None = None) -> None:
        self.columns: dict[str, Any] = {}
        for name, value in (columns or {}).items():
            self[name] = value

    # ----------------------------------------------------------------------- columns

    def __len__(self) -> int:
        return _rows(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, name: str) -> Any:
        return self.columns[name]

    def __setitem__(self, name: str, value: Any) -> None:
        if not isinstance(value, torch.Tensor):
            value = list(value)
        if self.columns and _rows(value) != len(self):
            raise ValueError(f"column {name!r} has {_rows(value)} rows, the batch {len(self)}")
        self.columns[name] = value

    def __getattr__(self, name: str) -> Any:
        try:
            return self.columns[name]
        except KeyError:
            raise AttributeError(f"the batch has no column {name!r}; it has "
                                 f"{', '.join(self.columns) or 'none'}") from None

    def __contains__(self, name: object) -> bool:
        return name in self.columns

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def __getstate__(self) -> dict[str, Any]:
        return self.columns

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.columns = state

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}: {_shape(v)}" for k, v in self.columns.items())
        return f"Batch({len(self)} rows; {shown})"

    def keys(self) -> list[str]:
        return list(self.columns)

    def items(self):
        return self.columns.items()

    def get(self, name: str, default: Any = None) -> Any:
        return self.columns.get(name, default)

    def update(self, columns: Mapping[str, Any]) -> Batch:
        """Add or replace columns in place; returns the batch."""
        for name, value in columns.items():
            self[name] = value
        return self

    def select(self, names: Iterable[str]) -> Batch:
        """The named columns (a missing name is skipped), sharing their data."""
        return Batch({n: self.columns[n] for n in names if n in self.columns})

    def to_dict(self) -> dict[str, Any]:
        return dict(self.columns)

    # ----------------------------------------------------------------------- rows

    def take(self, index: torch.Tensor | Sequence[int] | slice) -> Batch:
        """Rows by a long index, a bool mask or a slice."""
        if isinstance(index, slice):
            return Batch({k: v[index] for k, v in self.columns.items()})
        index = torch.as_tensor(index)
        if index.dtype == torch.bool:
            index = index.nonzero().squeeze(1)
        rows = index.tolist()
        return Batch({k: v[index] if isinstance(v, torch.Tensor) else [v[i] for i in rows]
                      for k, v in self.columns.items()})

    def slice(self, start: int, stop: int) -> Batch:
        return self.take(slice(start, stop))

    def chunk(self, size: int) -> list[Batch]:
        """Consecutive pieces of at most `size` rows."""
        return [self.slice(a, a + size) for a in range(0, len(self), size)]

    def split(self, parts: int, group: int = 1) -> list[Batch]:
        """One contiguous share per data-parallel rank (`shard_bounds`), groups of `group`
        adjacent rows kept whole; a rank may get no rows when there are fewer groups than ranks."""
        if len(self) % group:
            raise ValueError(f"{len(self)} rows do not form groups of {group}")
        return [self.slice(a * group, b * group) for a, b in shard_bounds(len(self) // group, parts)]

    @classmethod
    def concat(cls, parts: Sequence[Batch], pad_value: int | float = 0) -> Batch:
        """The rows of every part in order; 2-D tensors padded to the widest part first."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls()
        names = parts[0].keys()
        out = {}
        for name in names:
            values = [p[name] for p in parts]
            if isinstance(values[0], torch.Tensor):
                out[name] = torch.cat(_pad_to_widest(values, pad_value, name in LEFT_PADDED))
            else:
                out[name] = [item for value in values for item in value]
        return cls(out)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        return Batch({k: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor)
                      else v for k, v in self.columns.items()})

    # ----------------------------------------------------------------------- rollouts

    def to_sequences(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask, position_ids), each (B, P + R), for a training forward of
        a rollout batch (`ROLLOUT_COLUMNS`).

        Position ids count the prompt's real tokens from 0 and continue through the response
        (and its padding, which the attention mask hides), as in verl.
        """
        input_ids = torch.cat([self.prompt_ids, self.response_ids], dim=1)
        attention_mask = torch.cat([self.prompt_mask, self.response_mask], dim=1)
        prompt_positions = (self.prompt_mask.cumsum(1) - 1).clamp(min=0)  # (B, P)
        steps = torch.arange(1, self.response_ids.shape[1] + 1, device=self.prompt_ids.device)
        response_positions = prompt_positions[:, -1:] + steps  # (B, R)
        return input_ids, attention_mask, torch.cat([prompt_positions, response_positions], 1)

    def with_sequences(self) -> Batch:
        """The training columns (`SEQUENCE_COLUMNS`, and a vision-language batch's
        `IMAGE_COLUMNS`) of a rollout batch, as a new batch."""
        input_ids, attention_mask, position_ids = self.to_sequences()
        return Batch({"input_ids": input_ids, "attention_mask": attention_mask,
                      "position_ids": position_ids, "response_mask": self.response_mask,
                      **{name: self[name] for name in IMAGE_COLUMNS if name in self}})


def sequence_columns(columns: Any) -> list[str]:
    """What a training forward of these columns reads: `SEQUENCE_COLUMNS`, and the image
    columns where there are images."""
    return [*SEQUENCE_COLUMNS, *(name for name in IMAGE_COLUMNS if name in columns)]


def images_of(columns: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The image columns (pixel_values, image_grid_thw) of rows, None without images."""
    if "pixel_values" not in columns:
        return None
    return columns["pixel_values"], columns["image_grid_thw"]


class PromptIds(list):
    """A prompt's token ids carrying its images' model inputs for a vision-language model:
    `image` has `pixel_values` (patches, dims) and `image_grid_thw` (images, 3) (an
    `rl_core.models.vision.ImagePrompt`). Everywhere else it is the list of ids; pickled with
    its image, so the ranks that generate from it get both."""

    def __init__(self, ids: Sequence[int], image: Any) -> None:
        super().__init__(ids)
        self.image = image


def image_columns(images: Sequence[Any | None]) -> dict[str, torch.Tensor]:
    """The image columns of rows with these images (each with `pixel_values` and
    `image_grid_thw`; None: a row without images)."""
    real = [im for im in images if im is not None and im.pixel_values.numel()]
    dims = real[0].pixel_values.shape[1] if real else 1
    patches = max((im.pixel_values.shape[0] for im in real), default=1)
    count = max((im.image_grid_thw.shape[0] for im in real), default=1)
    pixels = torch.zeros(len(images), patches, dims, dtype=real[0].pixel_values.dtype
                         if real else torch.float32)
    grids = torch.zeros(len(images), count, 3, dtype=torch.long)
    for row, image in enumerate(images):
        if image is not None and image.pixel_values.numel():
            pixels[row, :image.pixel_values.shape[0]] = image.pixel_values
            grids[row, :image.image_grid_thw.shape[0]] = image.image_grid_thw
    return {"pixel_values": pixels, "image_grid_thw": grids}


def image_columns_of(prompts: Sequence[Sequence[int]]) -> dict[str, torch.Tensor] | None:
    """The image columns of prompts some of which carry images (`PromptIds`); None when none
    does."""
    images = [getattr(prompt, "image", None) for prompt in prompts]
    if all(image is None for image in images):
        return None
    return image_columns(images)


def left_pad(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids, mask), each (N, P) long, left-padded to the longest prompt."""
    if not prompts:
        raise ValueError("no prompts to generate from")
    lengths = [len(p) for p in prompts]
    if min(lengths) == 0:
        raise ValueError(f"prompt {lengths.index(0)} is empty; every prompt needs a token")
    width = max(lengths)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.as_tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def _rows(value: Any) -> int:
    return value.shape[0] if isinstance(value, torch.Tensor) else len(value)


def _shape(value: Any) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else f"list[{len(value)}]"


def _pad_to_widest(values: list[torch.Tensor], pad_value: int | float, left: bool) -> list[torch.Tensor]:
    if values[0].dim() != 2:
        return values
    width = max(v.shape[1] for v in values)
    return [F.pad(v, (width - v.shape[1], 0) if left else (0, width - v.shape[1]), value=pad_value)
            for v in values]
