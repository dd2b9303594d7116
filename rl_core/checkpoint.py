"""Checkpoints: a Hugging Face folder plus everything needed to resume exactly.

    <output_dir>/checkpoints/step_<N>/
        config.json, model.safetensors, tokenizer files   # loadable by plain transformers
        trainer_state.pt                                  # optimizer, scheduler, RNG, data cursor
        spec.yaml                                         # the resolved run spec
        dcp/actor/, dcp/critic/                           # fsdp2, megatron: sharded state
        critic/                                           # PPO: the value model

With `actor.strategy: fsdp2` the optimizer state and the float32 master weights are not gathered
anywhere: each rank writes its shards through `torch.distributed.checkpoint` (DCP) under `dcp/`,
and a resume on any number of ranks reads them back resharded; `trainer_state.pt` then keeps
only the schedule, the RNG and the data cursor. The Hugging Face weights are the model in
`model.dtype`; `python -m rl_core export` writes a folder from the master weights. With
`actor.strategy: megatron` the shards are Megatron's distributed checkpoint (the chunks' weights
and its distributed optimizer's state in Megatron's fully reshardable format; resuming is tested
on the layout that wrote it).

A checkpoint is written into a temporary folder and renamed into place, so a folder named
step_<N> is always complete; a crash mid-write leaves only a `.tmp-*` folder, removed next time.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "trainer_state.pt"
SHARDED_DIRS = {"actor": "dcp/actor", "critic": "dcp/critic"}  # a DCP folder per sharded role
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(output_dir: str | Path, step: int, *, state: dict[str, Any], spec_yaml: str,
                    model=None, tokenizer=None, write=None) -> Path:
    """Write step_<step> atomically and return its path. The weights come from `model` and
    `tokenizer` (`save_pretrained`), or from `write(folder)` (roles in other processes write
    their own files into the temporary folder)."""
    root = checkpoint_root(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step}"
    tmp = root / f".tmp-step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    if model is not None:
        model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if write is not None:
        write(tmp)
    torch.save({**state, "step": step}, tmp / STATE_FILE)
    (tmp / "spec.yaml").write_text(spec_yaml)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    root = checkpoint_root(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    found = list_checkpoints(output_dir)
    return found[-1][1] if found else None


def clean_partial(output_dir: str | Path) -> None:
    root = checkpoint_root(output_dir)
    if root.is_dir():
        for child in root.glob(".tmp-step_*"):
            shutil.rmtree(child, ignore_errors=True)


def load_state(checkpoint: str | Path) -> dict[str, Any]:
    path = Path(checkpoint) / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint} is not a checkpoint: {STATE_FILE} is missing")
    return torch.load(path, weights_only=False)
