"""Built-in warm starts (`tiny:<name>` of rl_core.models.presets.WARM_BASES): a tiny model after
a short SFT on a built-in task, made on first use and cached beside the tiny models.

The SFT stops at the first validation (every 10 steps) that reaches its target accuracy
(`STOP_AT`), not after a fixed number of steps: the step at which the tiny model starts to add
varies with the seed and with the machine's rounding (after the same 400 steps four seeds gave
10-60 %, one seed 44 % on one thread and 28 % on two; an H200 gave 19 %), while the accuracy,
once it rises, climbs some 20 points in 50 steps. Stopped at 40 %, five seed and thread
combinations on a CPU landed at 40-48 % after 380-490 steps.

    folder = resolve_warm("small-addition")   # SFT on first use (about a minute), then cached
    spec = with_model_folders(spec)           # model.path: tiny:small-addition -> that folder

The folder is a plain Hugging Face folder (the SFT's last checkpoint without its optimizer
state) with `warm.json` recording the recipe and the validation accuracy it reached. Several
processes asking at once (the roles of a run on one node) build it once: the first takes a file
lock and the others wait for it, then find the folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rl_core.models.presets import WARM_BASES, parse_tiny_path
from rl_core.models.registry import MODEL_FIELDS, file_lock, with_registered_models
from rl_core.models.tiny import tiny_cache_key, tiny_cache_root
from rl_core.spec import RunSpec

log = logging.getLogger("rl_core")

# Bump when a recipe below changes in a way its fields do not show (the SFT code itself).
WARM_FORMAT = 2
# The SFT of each warm start: the recipe of examples/sft_tiny.yaml (the learning demonstration's
# base), validated once at the end. The task's data and seed are those the demo run uses, so the
# demo's validation problems are never seen by the SFT.
RECIPES: dict[str, dict[str, Any]] = {
    "small-addition": {
        "algorithm": "grpo",
        "seed": 1,
        "model": {"path": "tiny:small"},
        "data": {"synthetic": {"task": "addition", "digits": 2, "num_train": 4000, "num_val": 200},
                 "prompt_template": "chat", "train_batch_size": 64, "val_batch_size": 200},
        "rollout": {"n_samples_per_prompt": 2, "max_new_tokens": 5},
        "actor": {"lr": 1.0e-3, "warmup_steps": 20, "ppo_mini_batch_size": 64,
                  "ppo_micro_batch_size": 64},
        "reward": {"functions": [{"name": "exact_match"}]},
        "trainer": {"total_steps": 1500, "eval_every": 10, "log_every": 50, "save_every": 0,
                    "logger": []},
    },
}
# the mixture of experts learns from the same SFT (its balancing loss at Qwen3-MoE's weight)
RECIPES["moe-addition"] = {**RECIPES["small-addition"], "model": {"path": "tiny:moe"}}
# the vision-language model counts squares in pictures (answers 0-4: a guess is right 20 %)
RECIPES["vl-squares"] = {
    **RECIPES["small-addition"], "model": {"path": "tiny:vl"},
    "data": {"synthetic": {"task": "squares", "num_train": 2000, "num_val": 100},
             "prompt_template": "chat", "train_batch_size": 32, "val_batch_size": 100},
    "rollout": {"n_samples_per_prompt": 2, "max_new_tokens": 3},
    "actor": {"lr": 1.0e-3, "warmup_steps": 20, "ppo_mini_batch_size": 32,
              "ppo_micro_batch_size": 32},
    # counting is learnt in a few steps (10: under 40 %, 20: 74 %): validated every 2
    "trainer": {"total_steps": 1000, "eval_every": 2, "log_every": 50, "save_every": 0,
                "logger": []},
}
# The validation accuracy at which each SFT stops (at most its recipe's total_steps). The check
# reads the validation problems the demo run validates on too: a stopping rule on one number,
# not training on them.
STOP_AT: dict[str, float] = {"small-addition": 0.40, "moe-addition": 0.40, "vl-squares": 0.40}
HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
            "preprocessor_config.json")


def warm_cache_key(name: str) -> str:
    """Folder name of a warm start: its name and a digest of its recipe and of the tiny model
    it starts from, so a changed recipe or tiny model never reuses a stale build."""
    recipe = {"format": WARM_FORMAT, "sft": RECIPES[name], "stop_at": STOP_AT.get(name),
              "base": tiny_cache_key(WARM_BASES[name].size)}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{name}-{digest}"


def with_model_folders(spec: RunSpec) -> RunSpec:
    """`spec` with local folders in place of a warm start's name (built on first use) and of a
    registered model version (`models:/name/3`, downloaded on first use:
    rl_core.models.registry.with_registered_models) in `model.path`, `model.tokenizer_path` and
    `critic.model_path`; the same spec when it names neither. Every node of a run reads the
    folder from the cache: on several nodes, ASCENT_CACHE_DIR is shared storage, as model
    folders are."""
    spec = with_registered_models(spec)
    changes: dict[str, Any] = {}
    for section, field in MODEL_FIELDS:
        value = getattr(getattr(spec, section), field)
        name = parse_tiny_path(value) if isinstance(value, str) else None
        if name in WARM_BASES:
            current = changes.get(section, getattr(spec, section))
            changes[section] = current.model_copy(update={field: str(resolve_warm(name))})
    return spec.model_copy(update=changes) if changes else spec


def resolve_warm(name: str) -> Path:
    """The folder of the warm start `name`, built by its SFT on first use and reused after."""
    folder = tiny_cache_root() / warm_cache_key(name)
    if (folder / "warm.json").is_file():
        return folder
    with file_lock(folder.with_name(f".{folder.name}.lock")):
        if not (folder / "warm.json").is_file():  # another process may have built it meanwhile
            _build(name, folder)
    return folder


def _build(name: str, folder: Path) -> None:
    from rl_core.recipes.sft import SFTTrainer
    from rl_core.spec import resolve_spec
    from rl_core.tracking import make_tracker

    recipe, target = RECIPES[name], STOP_AT.get(name)
    log.info("building tiny:%s (once, cached in %s): %s", name, folder.parent,
             WARM_BASES[name].description)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        spec = resolve_spec({**recipe, "name": f"warm-{name}",
                             "trainer": {**recipe["trainer"], "output_dir": str(work / "sft")}})
        # its metrics stay in its own folder: never in the MLflow run of the run that asked
        tracker = make_tracker(spec, work / "sft", environ={})
        until = None if target is None else (lambda m: m["val/accuracy"] >= target)
        summary = SFTTrainer(spec, tracker=tracker).fit(until=until)
        steps = int(summary["checkpoint_step"])
        staging = work / "model"
        staging.mkdir()
        checkpoint = work / "sft" / "checkpoints" / f"step_{steps}"
        for file in HF_FILES:
            if (checkpoint / file).is_file():
                shutil.copy2(checkpoint / file, staging / file)
        accuracy = summary.get("val/accuracy")
        (staging / "warm.json").write_text(json.dumps({
            "name": f"tiny:{name}", "description": WARM_BASES[name].description,
            "sft": recipe, "stop_at": target, "sft_steps": steps, "val_accuracy": accuracy},
            indent=2) + "\n")
        for path in [staging, *staging.iterdir()]:
            path.chmod(0o755 if path.is_dir() else 0o644)  # Ray workers of other users read it
        staging.rename(folder)
        log.info("built tiny:%s: validation accuracy %s after %d SFT steps", name,
                 "unknown" if accuracy is None else f"{accuracy:.0%}", steps)
    finally:
        shutil.rmtree(work, ignore_errors=True)
