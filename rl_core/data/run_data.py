"""The datasets a run spec describes: its files, or its `data.synthetic` section materialised.

    train, val = load_prompt_data(spec, cache_dir="outputs/data")   # GRPO, DAPO, PPO
    train, val = load_pair_data(spec)                               # DPO from files

Synthetic files always use the fields `prompt` and `answer`, whatever `data.prompt_key` and
`data.answer_key` say.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rl_core.data.datasets import (
    DataError,
    PairRecord,
    PromptRecord,
    load_pair_files,
    load_prompt_files,
)
from rl_core.data.synthetic import IMAGE_FIELD, VISUAL_TASK, materialize_synthetic

if TYPE_CHECKING:
    from rl_core.spec import RunSpec


def data_files(spec: RunSpec, cache_dir: str | Path | None = None) -> tuple[list[str], list[str]]:
    """(train files, validation files) of the spec; synthetic data is written under `cache_dir`
    (default: `<trainer.output_dir>/data`)."""
    data = spec.data
    if data.synthetic is None:
        return list(data.train_files), list(data.val_files)
    cache = Path(cache_dir) if cache_dir is not None else Path(spec.trainer.output_dir) / "data"
    train, val = materialize_synthetic(data.synthetic, spec.seed, cache)
    return [str(train)], [str(val)] if val is not None else []


def load_prompt_data(
    spec: RunSpec, cache_dir: str | Path | None = None
) -> tuple[list[PromptRecord], list[PromptRecord]]:
    """Training and validation prompts of the spec (validation may be empty)."""
    train_files, val_files = data_files(spec, cache_dir)
    if spec.data.synthetic is not None:
        visual = spec.data.synthetic.task == VISUAL_TASK
        keys = {"prompt_key": "prompt", "answer_key": "answer",
                "image_key": IMAGE_FIELD if visual else None}
    else:
        keys = {"prompt_key": spec.data.prompt_key, "answer_key": spec.data.answer_key,
                "image_key": spec.data.image_key}
    val = load_prompt_files(val_files, **keys) if val_files else []
    return load_prompt_files(train_files, **keys), val


def load_pair_data(spec: RunSpec) -> tuple[list[PairRecord], list[PairRecord]]:
    """Training and validation preference pairs of a spec whose data are files."""
    data = spec.data
    if data.synthetic is not None or not data.chosen_key or not data.rejected_key:
        raise DataError(
            "preference pairs come from files: set data.train_files, data.chosen_key "
            "and data.rejected_key"
        )
    keys = {
        "prompt_key": data.prompt_key,
        "chosen_key": data.chosen_key,
        "rejected_key": data.rejected_key,
    }
    val = load_pair_files(data.val_files, **keys) if data.val_files else []
    return load_pair_files(data.train_files, **keys), val
