"""The built-in warm start `tiny:small-addition` (rl_core.recipes.warm): an SFT of tiny:small made
on first use, built once when several callers ask at once, and tracked nowhere but in its own
folder (never in the MLflow run of the run that asked for it).

What is tested here does not depend on how long the SFT trains, so the build runs a short
version of the recipe (SHORT_STEPS, a few seconds instead of about a minute). That the real
recipe's warm start is right part of the time is shown where it is used as it ships: the new
user's browser test (tests/browser/test_new_user.py) trains from it and checks its validation
accuracy at step 0."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from rl_core.models.loading import ModelLoadError, load_model_and_tokenizer, resolve_model_path
from rl_core.data.datasets import read_rows
from rl_core.recipes.warm import (
    RECIPES,
    STOP_AT,
    TRANSCRIPTS,
    transcript_data,
    resolve_warm,
    warm_cache_key,
    with_model_folders,
)
from rl_core.rewards.functions import exact_match
from rl_core.spec import resolve_spec

SHORT_STEPS = 20


def short_recipe(name: str) -> dict:
    """`name`'s recipe with SHORT_STEPS SFT steps and a smaller validation set."""
    recipe = RECIPES[name]
    return {**recipe,
            "data": {**recipe["data"], "synthetic": {**recipe["data"]["synthetic"], "num_val": 50},
                     "val_batch_size": 50},
            "trainer": {**recipe["trainer"], "total_steps": SHORT_STEPS,
                        "eval_every": SHORT_STEPS, "log_every": 10}}


def test_the_warm_start_is_built_once_and_records_its_recipe_and_accuracy(tmp_path, monkeypatch,
                                                                           caplog):
    monkeypatch.setenv("ASCENT_CACHE_DIR", str(tmp_path))
    shipped_key = warm_cache_key("small-addition")
    monkeypatch.setitem(RECIPES, "small-addition", short_recipe("small-addition"))
    assert warm_cache_key("small-addition") != shipped_key  # another recipe, another folder
    # a tracking server that does not answer: the SFT must not try to log to it
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv("MLFLOW_RUN_ID", "the-run-that-asked")
    folders, errors = [], []

    def resolve():
        try:
            folders.append(resolve_warm("small-addition"))
        except Exception as exc:  # reported below
            errors.append(exc)

    with caplog.at_level(logging.INFO, logger="rl_core"):
        callers = [threading.Thread(target=resolve) for _ in range(2)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(timeout=600)
    assert errors == [] and len(folders) == 2 and folders[0] == folders[1]
    folder = folders[0]
    assert folder == tmp_path / "tiny" / warm_cache_key("small-addition")
    assert sum("building tiny:small-addition" in r.getMessage() for r in caplog.records) == 1
    record = json.loads((folder / "warm.json").read_text())
    assert record["name"] == "tiny:small-addition"
    assert record["sft"] == RECIPES["small-addition"]
    assert 0.0 <= record["val_accuracy"] <= 1.0, record["val_accuracy"]  # validated at the end
    assert record["stop_at"] == STOP_AT["small-addition"]
    assert record["sft_steps"] == SHORT_STEPS  # 20 steps never reach the target: all of them
    assert not (folder / "trainer_state.pt").exists()  # weights and tokenizer only
    assert [p.name for p in tmp_path.joinpath("tiny").iterdir() if p.name.startswith(".")
            and not p.name.endswith(".lock")] == []  # no staging folder left behind
    model, tokenizer = load_model_and_tokenizer(folder)
    assert model.config.hidden_size == 128 and tokenizer.eos_token
    assert resolve_warm("small-addition") == folder  # cached: no second build
    # the recipes put the folder in the spec; loading the name itself says where it comes from
    spec = resolve_spec({"model": {"path": "tiny:small-addition"}, "data": {"synthetic": {}}})
    assert with_model_folders(spec).model.path == str(folder)
    assert with_model_folders(spec).data == spec.data and spec.model.path == "tiny:small-addition"
    with pytest.raises(ModelLoadError, match="a warm start, made on first use by the training"):
        resolve_model_path("tiny:small-addition")


def test_an_unknown_warm_start_names_the_choices():
    with pytest.raises(ModelLoadError, match="tiny:small-addition"):
        resolve_model_path("tiny:small-subtraction")


def test_the_sft_stops_at_the_first_validation_that_reaches_its_target(tmp_path, monkeypatch):
    """The step the tiny model learns to add at moves with the seed and the machine's rounding;
    the warm start stops on the accuracy instead (here a target the first validation meets)."""
    monkeypatch.setenv("ASCENT_CACHE_DIR", str(tmp_path))
    recipe = short_recipe("small-addition")
    recipe["trainer"] = {**recipe["trainer"], "eval_every": 5}
    monkeypatch.setitem(RECIPES, "small-addition", recipe)
    monkeypatch.setitem(STOP_AT, "small-addition", 0.0)

    folder = resolve_warm("small-addition")

    record = json.loads((folder / "warm.json").read_text())
    assert record["sft_steps"] == 5 and record["stop_at"] == 0.0
    assert record["val_accuracy"] >= 0.0
    model, _ = load_model_and_tokenizer(folder)  # the checkpoint of step 5, in place
    assert model.config.hidden_size == 128



def test_the_calculator_agent_learns_from_transcripts_of_its_task(tmp_path, monkeypatch, caplog):
    """tiny:small-calculator: its SFT reads transcripts of its task's training problems (calls
    and answers in the rollout's tokens, most answered at once), validates the copying on the
    calls (from their expression on) and answers of the first validation problems with whole
    texts compared, and logs its progress at each validation."""
    monkeypatch.setenv("ASCENT_CACHE_DIR", str(tmp_path))
    recipe = RECIPES["small-calculator"]
    data = transcript_data(recipe, TRANSCRIPTS["small-calculator"], tmp_path / "data")
    assert data["prompt_template"] == "plain" and "synthetic" not in data
    train = [row for _, row in read_rows(data["train_files"][0])]
    val = [row for _, row in read_rows(data["val_files"][0])]
    assert len(val) == 2 * TRANSCRIPTS["small-calculator"]["num_val"]  # a call, an answer
    assert val[0]["prompt"].endswith('<tool_call>{"name":"calculator","arguments":{"expression":"')
    assert val[0]["answer"].endswith('"}}</tool_call>') and val[1]["answer"].startswith("<answer>")
    calls = [row for row in train if row["answer"].startswith("<tool_call>")]
    answered = len(train) - 2 * len(calls)  # a called problem has two rows, a direct one one
    assert answered + len(calls) == recipe["data"]["synthetic"]["num_train"]
    share = TRANSCRIPTS["small-calculator"]["direct"]
    assert share - 0.05 < answered / (answered + len(calls)) < share + 0.05
    assert '"expression":"' in calls[0]["answer"] and "<|im_start|>assistant" in calls[0]["prompt"]
    # a turn is right when its whole text is the transcript's: a call has no <answer> tag
    (reward,) = recipe["reward"]["functions"]
    assert exact_match(calls[0]["answer"], calls[0]["answer"], **reward["kwargs"]) == 1.0
    assert exact_match(calls[1]["answer"], calls[0]["answer"], **reward["kwargs"]) == 0.0

    short = {**recipe, "trainer": {**recipe["trainer"], "total_steps": 4, "eval_every": 2}}
    short["data"] = {**short["data"], "synthetic": {**short["data"]["synthetic"],
                                                    "num_train": 64}}
    monkeypatch.setitem(RECIPES, "small-calculator", short)
    monkeypatch.setitem(TRANSCRIPTS, "small-calculator", {"direct": 0.6, "num_val": 4})
    with caplog.at_level(logging.INFO, logger="rl_core"):
        folder = resolve_warm("small-calculator")
    record = json.loads((folder / "warm.json").read_text())
    assert record["sft_steps"] == 4 and record["name"] == "tiny:small-calculator"
    progress = [r.getMessage() for r in caplog.records if "after 2 steps" in r.getMessage()]
    assert progress and "stops at 50%" in progress[0]
