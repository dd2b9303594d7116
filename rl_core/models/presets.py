"""Named sizes of the built-in tiny models (`tiny:<size>`); torch-free so the CLI can list them.

Sizes are chosen so that a model learns short arithmetic on a couple of CPU cores (parameters
with the 263-token byte vocabulary, input and output embeddings tied):

| size  | hidden | layers | heads (kv) | intermediate | positions | parameters |
| ----- | ------ | ------ | ---------- | ------------ | --------- | ---------- |
| nano  | 32     | 2      | 4 (2)      | 64           | 256       | 27,136     |
| small | 128    | 4      | 4 (2)      | 512          | 512       | 1,018,880  |
| base  | 256    | 6      | 8 (4)      | 1024         | 1024      | 5,971,968  |

`nano` is for unit tests (a forward pass takes microseconds); `small` is the default CPU model
for learning runs (supervised on 2-digit addition in the chat template, batch 64, AdamW at 2e-3,
it reaches about 90% exact-match answers after 4 minutes on 2 CPU cores); `base` leaves
headroom for longer numbers and harder tasks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class TinySize:
    """Shape of a tiny Qwen2 model; field names are those of `transformers.Qwen2Config`."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int

    def replace(self, **overrides: int | None) -> TinySize:
        """A copy with the non-None `overrides` applied and checked (ValueError on a bad shape)."""
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(
                f"unknown tiny-model field(s) {', '.join(unknown)}; "
                f"known: {', '.join(f.name for f in dataclasses.fields(self))}"
            )
        size = dataclasses.replace(self, **{k: v for k, v in overrides.items() if v is not None})
        size.check()
        return size

    def check(self) -> None:
        """Raise ValueError naming the first field that makes this shape unbuildable."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{field.name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(
                f"head size hidden_size/num_attention_heads = "
                f"{self.hidden_size // self.num_attention_heads} must be even (rotary embeddings)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not divisible by "
                f"num_key_value_heads {self.num_key_value_heads}"
            )


TINY_SIZES: dict[str, TinySize] = {
    "nano": TinySize(32, 2, 4, 2, 64, 256),
    "small": TinySize(128, 4, 4, 2, 512, 512),
    "base": TinySize(256, 6, 8, 4, 1024, 1024),
}

TINY_PREFIX = "tiny:"


@dataclass(frozen=True)
class WarmBase:
    """A built-in model that starts where RL can learn: the tiny model `size` after a short SFT
    on a built-in task (rl_core.recipes.warm builds it on first use and caches it)."""

    size: str
    description: str


# `tiny:<name>` warm starts. From the raw tiny model every reward is 0 and RL has nothing to
# learn from; these are right part of the time, so rewards and accuracy rise from the first
# steps (the demo run and the submit form's default start from `tiny:small-addition`).
WARM_BASES: dict[str, WarmBase] = {
    "small-addition": WarmBase(
        "small", "tiny:small after a short SFT on two-digit addition in the chat format, "
        "stopped when it first gets 40 % of the validation problems right (a few hundred "
        "steps, about a minute on 2 CPU cores, made once): right about half the time"),
}


def parse_tiny_path(path: str) -> str | None:
    """`"tiny:small"` -> `"small"`, `"tiny:small-addition"` -> `"small-addition"`; None for any
    other path. ValueError for an unknown name."""
    if not path.startswith(TINY_PREFIX):
        return None
    size = path[len(TINY_PREFIX) :]
    if size not in TINY_SIZES and size not in WARM_BASES:
        raise ValueError(
            f"{path}: unknown tiny model {size!r}; choose one of "
            + ", ".join(f"tiny:{name}" for name in [*TINY_SIZES, *WARM_BASES])
        )
    return size


def get_size(size: str | TinySize) -> TinySize:
    """The preset named `size` (or `size` itself); ValueError listing the presets otherwise."""
    if isinstance(size, TinySize):
        return size
    if size in WARM_BASES:  # a warm start has the shape of the model it was trained from
        size = WARM_BASES[size].size
    try:
        return TINY_SIZES[size]
    except KeyError:
        raise ValueError(
            f"unknown tiny model size {size!r}; choose one of {', '.join(TINY_SIZES)}"
        ) from None
