"""The run spec's limits and shared pieces: the algorithms and device kinds, the bounds of every
number and list (`MAX_*`), the bounded-JSON and plain-text rules, the tiny-model names, and the
strict base model every section derives from."""

from __future__ import annotations

import json
import math
import re
import types
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    JsonValue,
    ValidationInfo,
    field_validator,
)

ALGORITHMS = ("grpo", "dapo", "ppo", "dpo")
DEVICE_TYPES = ("npu", "gpu", "cpu")

Algorithm = Literal["grpo", "dapo", "ppo", "dpo"]
DeviceType = Literal["npu", "gpu", "cpu"]
AdvEstimator = Literal[
    "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae"
]
KLType = Literal["k1", "abs", "k2", "k3", "low_var_kl", "mse"]
LossAggMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]

# Estimators whose baseline comes from the other responses to the same prompt.
GROUP_ESTIMATORS = frozenset({"grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"})

Violation = tuple[str, str]  # (field path, message)

# --------------------------------------------------------------------------- limits
# A spec is a small document: these bound what any source (JSON body, overrides, YAML) may send.

MAX_YAML_CHARS = 65_536  # characters of YAML text read at once (a spec file, an override value)
MAX_SPEC_DEPTH = 16  # nesting levels of mappings and lists; the top-level mapping is level 1
MAX_SPEC_NODES = 4_000  # mappings, list items and scalars in one spec
MAX_SPEC_BYTES = 65_536  # the spec serialized as JSON
MAX_KWARGS_DEPTH = 8  # nesting levels inside one reward function's kwargs
MAX_KWARGS_NODES = 1_000  # mappings, list items and scalars in one reward function's kwargs
MAX_KWARGS_BYTES = 16_384  # one reward function's kwargs serialized as JSON
MAX_INT = 2**63  # every integer of a spec is below this (64-bit signed)

# Plausible upper bounds of the numeric fields.
MAX_NODES = 4_096  # resources.num_nodes
MAX_DEVICES_PER_NODE = 64  # resources.devices_per_node
MAX_DEVICES = MAX_NODES * MAX_DEVICES_PER_NODE  # devices in one run
MAX_PARALLEL = 1_024  # tensor, pipeline and context parallel sizes
MAX_STEPS = 10_000_000  # steps, warmups, intervals, horizons
MAX_EPOCHS = 10_000  # trainer.total_epochs
MAX_STALENESS = 64  # trainer.max_staleness: batches generated ahead, each kept in memory
MAX_TOKENS = 131_072  # prompt and response lengths
MAX_TOKEN_BUDGET = 1_048_576  # tokens of one dynamic micro-batch
MAX_BATCH = 16_384  # prompts in a batch
MAX_MICRO_BATCH = 4_096  # responses per device per forward
MAX_SAMPLES = 1_024  # responses per prompt
MAX_LIST = 1_024  # items of a list of steps, ranks, files or module names
MAX_IMAGES_PER_PROMPT = 8  # images of one vision-language prompt (rl_core.data.images)
MAX_IMAGE_BYTES = 32 * 2**20  # one image file
MAX_IMAGE_PIXELS = 4096 * 4096  # one picture: a guard against decompression bombs


def scan(value: Any, max_depth: int, max_nodes: int, json_only: bool = False) -> Violation | None:
    """The first (dotted path, problem) of a nested value beyond the bounds, found without
    recursion; None when it fits. `json_only` also refuses non-text keys, inf, nan and integers
    of more than 64 bits. Every mapping, list and scalar counts as one value."""
    stack: list[tuple[tuple[str, ...], Any, int]] = [((), value, 1)]
    nodes = 1
    while stack:
        path, node, depth = stack.pop()
        where = ".".join(path)
        if isinstance(node, Mapping):
            children: Iterable[tuple[Any, Any]] = node.items()
        elif isinstance(node, list | tuple):
            children = enumerate(node)
        else:
            problem = _scalar_problem(node) if json_only or isinstance(node, str) else None
            if problem:
                return where, problem
            continue
        if depth > max_depth:
            return where, f"nested deeper than the limit of {max_depth} levels: flatten it"
        nodes += len(node)
        if nodes > max_nodes:
            return "", (
                f"more than the limit of {max_nodes} values (mappings, list items and scalars): "
                "make it smaller; large data belongs in files"
            )
        for key, child in children:
            if json_only and isinstance(node, Mapping) and not isinstance(key, str):
                return where, f"key {key!r} must be text: quote it"
            if isinstance(key, str) and "\x00" in key:
                return where, f"key {key!r} holds a NUL character, which text may not hold"
            stack.append(((*path, str(key)), child, depth + 1))
    return None


# Characters a name may not hold although they are text: controls (NUL, newline, escape, C1),
# line and paragraph separators, and the bidirectional controls, which reorder what a reader
# sees ("invoice\u202efdp.exe" shows as "invoiceexe.pdf"). PLAIN_TEXT_PATTERN says the same as a
# regular expression (for OpenAPI documents, where Python and JavaScript read it alike).
NOT_PLAIN_CHARS = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
PLAIN_TEXT_PATTERN = f"^[^{NOT_PLAIN_CHARS}]*$"
_NOT_PLAIN_CHAR = re.compile(f"[{NOT_PLAIN_CHARS}]")


def plain_text_problem(text: str) -> str | None:
    """Why `text` is not one line of plain text (None when it is): a control character (NUL,
    newline, tab, escape), a line separator or a bidirectional control such as a right-to-left
    override. Any script and emoji are plain text."""
    found = _NOT_PLAIN_CHAR.search(text)
    if found is None:
        return None
    char = found.group()
    code = f"U+{ord(char):04X}"
    if char == "\x00":
        return "holds a NUL character, which text may not hold: remove it"
    if unicodedata.category(char) == "Cc":
        return f"holds the control character {code}: use one line of plain text"
    if char in "\u2028\u2029":
        return f"holds the line separator {code}: use one line of plain text"
    return (f"holds the bidirectional control {code} (such as a right-to-left override), which "
            "changes how the text reads: use plain text")


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, str) and "\x00" in value:
        return "holds a NUL character, which text may not hold: remove it"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number: use a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT <= value < MAX_INT:
        return f"integers must fit in 64 bits (below {MAX_INT}): use a smaller number"
    return None


def _bounded_json(value: Any) -> Any:
    """Reward kwargs: JSON values within depth, count and size limits (checked before typing)."""
    problem = scan(value, MAX_KWARGS_DEPTH, MAX_KWARGS_NODES, json_only=True)
    if problem:
        where, message = problem
        raise ValueError(f"{where}: {message}" if where else message)
    size = len(json.dumps(value, default=str))
    if size > MAX_KWARGS_BYTES:
        raise ValueError(
            f"{size} bytes as JSON, more than the limit of {MAX_KWARGS_BYTES}: pass less, or a "
            "file name the function reads"
        )
    return value


# A mapping of JSON values with text keys (finite numbers, bounded depth and size).
JsonMapping = Annotated[dict[str, JsonValue], BeforeValidator(_bounded_json)]


def _known_tiny(value: str | None) -> str | None:
    """A `tiny:` name must be a built-in preset (the path policy lets only those through); a
    `models:/` path must name a registered version by number or alias."""
    if value is not None:
        from rl_core.models.presets import parse_tiny_path  # torch-free
        from rl_core.models.registry import parse_registry_uri  # torch-free

        parse_tiny_path(value)  # ValueError naming the presets
        parse_registry_uri(value)  # ValueError naming the two forms
    return value


# A model folder, the name of a built-in tiny model (`tiny:small`) or a registered model version
# (`models:/adder/3`, `models:/adder@champion`).
ModelLocation = Annotated[str, AfterValidator(_known_tiny)]


class Strict(BaseModel):
    # Unknown keys are errors; numbers given for text fields (name: 2024) become text; floats
    # are finite (inf and nan are refused).
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _whole_float_as_int(cls, value: Any, info: ValidationInfo) -> Any:
        """1e30 for an integer field is the integer 10**30, so its bound check says the limit."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, float) and value.is_integer() and field is not None:
            if without_none(field.annotation) is int:
                return int(value)
        return value


def is_model(tp: Any) -> bool:
    return get_origin(tp) is None and isinstance(tp, type) and issubclass(tp, BaseModel)


def without_none(tp: Any) -> Any:
    """`X | None` -> X; anything else unchanged."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp
