"""Export a checkpoint's policy as a Hugging Face folder that plain `transformers` loads.

    python -m rl_core export outputs/checkpoints/step_20 exported/ [--dtype bfloat16]
    export_checkpoint("outputs/checkpoints/step_20", "exported")

A checkpoint of `actor.strategy: fsdp2` keeps the float32 master weights sharded under
`dcp/actor` (`rl_core.checkpoint`); they are read here in one process, whatever number of ranks
wrote them, into the model the checkpoint's config.json describes, cast to the dtype asked for
(default: the run's `model.dtype`) and saved with the tokenizer. A checkpoint of the plain
engine has only its Hugging Face weights, which are re-saved in that dtype; so has one of
`actor.strategy: megatron` (its float32 main weights are shards of Megatron's optimizer, which
only its engine reads: its Hugging Face weights, in `model.dtype`, are the trained ones). So has
one trained with `actor.lora`: its Hugging Face weights are the base with the adapters merged
into it (W + (alpha / rank) · B A, `rl_core.engines.lora`), and its sharded state and its
`adapter/` folder are the adapters only. The folder is written beside `out` and renamed into
place, so `out` is complete or absent.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from rl_core.errors import InputError

MASTER_DIR = "dcp/actor"


def export_checkpoint(checkpoint: str | Path, out: str | Path, dtype: str | None = None
                      ) -> dict[str, Any]:
    """Write the policy of `checkpoint` to `out` (a new or empty folder); returns what was done."""
    import torch

    from rl_core.models.loading import (DTYPES, check_model_folder, copy_processor_files,
                                        load_model, load_tokenizer)

    source, target = Path(checkpoint), Path(out)
    if dtype is not None and dtype not in DTYPES:
        raise InputError(f"--dtype: {dtype!r} is not a dtype; choose one of {', '.join(DTYPES)}")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise InputError(f"{target}: exists and is not an empty folder; choose a new folder")
    check_model_folder(source)
    spec = _spec_of(source)
    trust = bool(spec.get("model", {}).get("trust_remote_code", False))
    dtype = dtype or spec.get("model", {}).get("dtype") or "float32"
    model = load_model(source, dtype="float32", trust_remote_code=trust)
    masters = source / MASTER_DIR
    megatron = spec.get("actor", {}).get("strategy") == "megatron"
    lora = spec.get("actor", {}).get("lora") is not None
    if megatron or lora:  # Megatron's shards need its layout to read, LoRA's are the adapters:
        masters = source / "none"  # the folder's (merged) weights are the model
    if (masters / ".metadata").is_file():
        _load_masters(model, masters)
    tokenizer = load_tokenizer(source, trust_remote_code=trust)
    model = model.to(DTYPES[dtype])
    staging = target.with_name(f".tmp-{target.name}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with torch.no_grad():
        model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    copy_processor_files(source, staging)
    if target.exists():
        target.rmdir()
    staging.rename(target)
    return {"out": str(target), "dtype": dtype,
            "weights": "sharded master weights" if masters.is_dir()
            else "merged LoRA weights" if lora else "checkpoint weights"}


def _spec_of(checkpoint: Path) -> dict[str, Any]:
    """The run spec saved with the checkpoint (empty when there is none, e.g. a model folder)."""
    import yaml

    path = checkpoint / "spec.yaml"
    if not path.is_file():
        return {}
    return yaml.safe_load(path.read_text()) or {}


def _load_masters(model: Any, folder: Path) -> None:
    """The float32 master weights of a DCP folder into `model`, in this one process."""
    from torch.distributed import checkpoint as dcp

    from rl_core.engines.fsdp import check_sharded_keys

    check_sharded_keys(folder, model)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(folder), no_dist=True)
    model.load_state_dict(state["model"])
