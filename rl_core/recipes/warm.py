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
import itertools
import json
import logging
import shutil
import tempfile
from collections.abc import Callable
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
# The calculator agent (`rollout.multi_turn` with the calculator) learns from multi-turn
# transcripts of the task's problems (rl_core.data.synthetic.calculator_transcripts, written
# before the SFT by `transcript_data`): the problems of `data.synthetic` become a call of the
# calculator and an answer copying its result, a `direct` share answered at once (a guess the
# tiny model rarely gets right: with more than half answered at once, greedy decoding guesses,
# and RL has the tool's use to learn). A validation turn is right when its text is the
# transcript's exactly (`from_answer_tag: false`), over the transcripts of the first `num_val`
# validation problems, a call's from its expression on (`_copying`). Writing the calls and
# answers needs copying the operands and the result, which the tiny model learns late and all at
# once: on a 2-core CPU the turns right stayed at 0-1 % up to step 450, then 14, 35, 45 and 73 %
# at steps 500-650 (about 7 minutes). The operands' varied lengths (digits 2: 0-99) matter: on
# products of exactly four digits each (one prompt length) the same model had not learned to
# copy after 1,600 steps.
RECIPES["small-calculator"] = {
    "algorithm": "grpo",
    "seed": 1,
    "model": {"path": "tiny:small"},
    "data": {"synthetic": {"task": "multiplication", "digits": 2, "num_train": 7000,
                           "num_val": 200},
             "prompt_template": "plain", "max_prompt_length": 256, "train_batch_size": 32,
             "val_batch_size": 80},
    "rollout": {"n_samples_per_prompt": 2, "max_new_tokens": 96},
    "actor": {"lr": 1.0e-3, "warmup_steps": 20, "ppo_mini_batch_size": 32,
              "ppo_micro_batch_size": 32},
    "reward": {"functions": [{"name": "exact_match", "kwargs": {"from_answer_tag": False}}]},
    "trainer": {"total_steps": 2000, "eval_every": 50, "log_every": 50, "save_every": 0,
                "logger": []},
}
TRANSCRIPTS: dict[str, dict[str, Any]] = {"small-calculator": {"direct": 0.6, "num_val": 40}}
EXPRESSION = '"expression":"'  # a calculator call's text up to its expression
# The validation accuracy at which each SFT stops (at most its recipe's total_steps). The check
# reads the validation problems the demo run validates on too: a stopping rule on one number,
# not training on them.
STOP_AT: dict[str, float] = {"small-addition": 0.40, "moe-addition": 0.40, "vl-squares": 0.40,
                             "small-calculator": 0.50}
HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json",
            "preprocessor_config.json")


def warm_cache_key(name: str) -> str:
    """Folder name of a warm start: its name and a digest of its recipe and of the tiny model
    it starts from, so a changed recipe or tiny model never reuses a stale build."""
    recipe = {"format": WARM_FORMAT, "sft": RECIPES[name], "stop_at": STOP_AT.get(name),
              "transcripts": TRANSCRIPTS.get(name),
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
        data = transcript_data(recipe, TRANSCRIPTS[name], work / "data") \
            if name in TRANSCRIPTS else recipe["data"]
        spec = resolve_spec({**recipe, "name": f"warm-{name}", "data": data,
                             "trainer": {**recipe["trainer"], "output_dir": str(work / "sft")}})
        # its metrics stay in its own folder: never in the MLflow run of the run that asked
        tracker = make_tracker(spec, work / "sft", environ={})
        until = None if target is None else _until(name, target, spec.trainer.eval_every)
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


def _until(name: str, target: float, every: int) -> Callable[[dict[str, float]], bool]:
    """The stopping rule of a warm start's SFT (validated every `every` steps): the validation
    accuracy reaches `target`. Each validation is logged (a long SFT shows its progress)."""
    validations = itertools.count(1)

    def reached(metrics: dict[str, float]) -> bool:
        log.info("tiny:%s, its SFT: validation accuracy %.0f%% after %d steps (stops at "
                 "%.0f%%)", name, 100 * metrics["val/accuracy"], every * next(validations),
                 100 * target)
        return metrics["val/accuracy"] >= target

    return reached


def transcript_data(recipe: dict[str, Any], options: dict[str, Any],
                    folder: Path) -> dict[str, Any]:
    """The data section of an SFT on calculator transcripts: the recipe's `data.synthetic`
    problems as transcripts in files under `folder` (rendered with the model's chat template,
    read as they are: `prompt_template: plain`)."""
    from rl_core.data.datasets import write_rows
    from rl_core.data.synthetic import calculator_transcripts, synthetic_splits
    from rl_core.data.templates import render_prompt
    from rl_core.models.loading import load_tokenizer

    data = dict(recipe["data"])
    synthetic = data.pop("synthetic")
    tokenizer = load_tokenizer(recipe["model"]["path"])
    train, val = synthetic_splits(synthetic["task"], num_train=synthetic["num_train"],
                                  num_val=synthetic["num_val"], seed=recipe["seed"],
                                  digits=synthetic["digits"])

    def render(prompt: str) -> str:
        return render_prompt(prompt, "chat", tokenizer)

    seed, direct = recipe["seed"], options["direct"]
    rows = {"train": calculator_transcripts(train, render, direct=direct, seed=seed),
            "val": [_copying(row) for row in
                    calculator_transcripts(val[:options["num_val"]], render, seed=seed)]}
    files = {part: str(write_rows(part_rows, folder / f"{part}.jsonl"))
             for part, part_rows in rows.items()}
    return {**data, "train_files": [files["train"]], "val_files": [files["val"]]}


def _copying(row: dict[str, Any]) -> dict[str, Any]:
    """A validation turn that checks the copying only: a call's prompt goes on to the start of
    its expression (whether to call or answer at once is the model's choice, which RL is to
    learn; greedy, a model that answers at once more often than not always would)."""
    start = row["answer"].find(EXPRESSION)
    if start < 0:
        return row
    cut = start + len(EXPRESSION)
    return {**row, "prompt": row["prompt"] + row["answer"][:cut], "answer": row["answer"][cut:]}
