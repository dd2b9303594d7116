"""Named sizes of the built-in tiny models (`tiny:<size>`); torch-free so the CLI can list them.

Sizes are chosen so that a model learns short arithmetic on a couple of CPU cores (parameters
with the 263-token byte vocabulary, input and output embeddings tied):

| size     | hidden | layers | heads (kv) | intermediate   | positions | parameters (active) |
| -------- | ------ | ------ | ---------- | -------------- | --------- | ------------------- |
| nano     | 32     | 2      | 4 (2)      | 64             | 256       | 27,136              |
| small    | 128    | 4      | 4 (2)      | 512            | 512       | 1,018,880           |
| base     | 256    | 6      | 8 (4)      | 1024           | 1024      | 5,971,968           |
| moe-nano | 32     | 2      | 4 (2)      | 4 × 32, top 2  | 256       | 39,584 (27,296)     |
| moe      | 128    | 4      | 4 (2)      | 8 × 256, top 2 | 512       | 3,381,504 (1,022,208) |

The `moe` sizes are mixtures of experts of the Qwen3-MoE shape (`Qwen3MoeForCausalLM`: every
layer's MLP is `num_experts` SwiGLU experts of width `moe_intermediate_size`, a linear router
picking `num_experts_per_tok` of them a token, their weights renormalised; per-head q/k norms);
`moe` matches `small`'s active width (two experts of 256 = one MLP of 512).

`nano` is for unit tests (a forward pass takes microseconds); `small` is the default CPU model
for learning runs (supervised on 2-digit addition in the chat template, batch 64, AdamW at 2e-3,
it reaches about 90% exact-match answers after 4 minutes on 2 CPU cores); `base` leaves
headroom for longer numbers and harder tasks.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TinySize:
    """Shape of a tiny Qwen2 model, or with `num_experts` a Qwen3-MoE one; field names are those
    of `transformers.Qwen2Config` and `Qwen3MoeConfig`."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int
    num_experts: int = 0  # 0: a dense model
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def dense_fields(self) -> dict[str, int]:
        """The fields of a dense shape (a MoE shape's without its expert fields when dense)."""
        fields = dataclasses.asdict(self)
        if not self.is_moe:
            for name in MOE_FIELDS:
                del fields[name]
        return fields

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
            least = 0 if field.name in MOE_FIELDS and not self.is_moe else 1
            if not isinstance(value, int) or value < least:
                raise ValueError(f"{field.name} must be a positive integer, got {value!r}")
        if self.num_experts_per_tok > self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} is more than "
                             f"num_experts {self.num_experts}")
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


MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size")

TINY_SIZES: dict[str, TinySize] = {
    "nano": TinySize(32, 2, 4, 2, 64, 256),
    "small": TinySize(128, 4, 4, 2, 512, 512),
    "base": TinySize(256, 6, 8, 4, 1024, 1024),
    "moe-nano": TinySize(32, 2, 4, 2, 64, 256, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32),
    "moe": TinySize(128, 4, 4, 2, 512, 512, num_experts=8, num_experts_per_tok=2,
                    moe_intermediate_size=256),
}

TINY_PREFIX = "tiny:"


@dataclass(frozen=True)
class TinyVision:
    """A tiny vision-language model (Qwen2.5-VL): the text model of the tiny preset `text` and
    a vision tower of this shape (field names those of `Qwen2_5_VLVisionConfig`)."""

    text: str
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int


# `tiny:vl`: the text model of tiny:small under a two-block vision tower (rl_core.models.vision)
TINY_VISION: dict[str, TinyVision] = {
    "vl": TinyVision("small", depth=2, hidden_size=64, num_heads=2, intermediate_size=128),
}


def get_vision(name: str) -> TinyVision:
    """The vision-language preset `name`; ValueError listing them otherwise."""
    try:
        return TINY_VISION[name]
    except KeyError:
        raise ValueError(f"unknown tiny vision-language model {name!r}; choose one of "
                         f"{', '.join(TINY_VISION)}") from None


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
    "moe-addition": WarmBase(
        "moe", "tiny:moe (a mixture of 8 experts, 2 a token) after the same SFT on two-digit "
        "addition, stopped at 40 % of the validation problems right (made once)"),
    "small-calculator": WarmBase(
        "small", "tiny:small after an SFT on transcripts of two-digit products, most answered "
        "at once and the rest by calling the calculator tool, stopped when it first copies half "
        "of the validation turns exactly (several hundred steps, about 7 minutes on 2 CPU "
        "cores, made once): it can call and copy but mostly guesses, so RL with "
        "`rollout.multi_turn` has the tool's use to learn"),
    "vl-squares": WarmBase(
        "vl", "tiny:vl (a vision-language model) after a short SFT on counting the squares in "
        "a picture, stopped at 40 % of the validation pictures right (made once)"),
}


def parse_tiny_path(path: str) -> str | None:
    """`"tiny:small"` -> `"small"`, `"tiny:small-addition"` -> `"small-addition"`; None for any
    other path. ValueError for an unknown name."""
    if not path.startswith(TINY_PREFIX):
        return None
    size = path[len(TINY_PREFIX) :]
    if size not in TINY_SIZES and size not in WARM_BASES and size not in TINY_VISION:
        raise ValueError(
            f"{path}: unknown tiny model {size!r}; choose one of "
            + ", ".join(f"tiny:{name}" for name in [*TINY_SIZES, *TINY_VISION, *WARM_BASES])
        )
    return size


def get_size(size: str | TinySize) -> TinySize:
    """The preset named `size` (or `size` itself); ValueError listing the presets otherwise."""
    if isinstance(size, TinySize):
        return size
    if size in WARM_BASES:  # a warm start has the shape of the model it was trained from
        size = WARM_BASES[size].size
    if size in TINY_VISION:  # a vision-language model: its text model's shape
        size = TINY_VISION[size].text
    try:
        return TINY_SIZES[size]
    except KeyError:
        raise ValueError(
            f"unknown tiny model size {size!r}; choose one of {', '.join(TINY_SIZES)}"
        ) from None


CACHE_ENV = "ASCENT_CACHE_DIR"


def cache_root() -> Path:
    """Where built and downloaded models live: `$ASCENT_CACHE_DIR`, else
    `$XDG_CACHE_HOME/ascent`, else `~/.cache/ascent` (tiny models under `tiny/`, registered
    versions under `models/`)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "ascent"
