"""Vision-language runs: GRPO on the tiny Qwen2.5-VL warm start raises its accuracy at counting
the squares in pictures, and a run whose data holds a broken picture fails before its first
step naming the record."""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image
from learning import rose, validation_gain
from test_trainer import read_metrics

from rl_core.data.datasets import DataError, write_rows
from rl_core.recipes.rl import RLTrainer
from rl_core.recipes.warm import with_model_folders
from rl_core.spec import resolve_spec


def counting_spec(out, steps: int, **data) -> dict:
    return {
        "algorithm": "grpo", "seed": 1, "model": {"path": "tiny:vl-squares"},
        "data": {"synthetic": {"task": "squares", "num_train": 2000, "num_val": 100},
                 "prompt_template": "chat", "train_batch_size": 16, "val_batch_size": 100,
                 **data},
        # sampled at 0.5: the warm start, stopped after a few SFT steps, is right when greedy
        # but its distribution is still flat (at 1.0 almost no sample was right: no signal)
        "rollout": {"n_samples_per_prompt": 8, "max_new_tokens": 3, "temperature": 0.5},
        "actor": {"lr": 2e-4, "ppo_mini_batch_size": 16, "ppo_micro_batch_size": 64},
        "reward": {"functions": [{"name": "exact_match"}]},
        "trainer": {"total_steps": steps, "eval_every": steps, "save_every": 0, "logger": [],
                    "output_dir": str(out)},
    }


def test_grpo_on_the_counting_warm_start_raises_validation_accuracy(tmp_path, tiny_cache):
    """tiny:vl-squares (the SFT of tiny:vl stopped at 40 %): 20 GRPO steps of 16 pictures x 8
    samples, validated on 100 pictures before and after (0.47 -> 0.61 here); the rollout, the
    reference and the update (packed) all read the pictures, and the training reward rises
    too."""
    out = tmp_path / "vl"
    spec = counting_spec(out, 20)
    spec["actor"]["use_remove_padding"] = True  # the rows with their pictures packed
    RLTrainer(with_model_folders(resolve_spec(spec))).fit()
    before, after = validation_gain(out)
    assert 0.2 < before < 0.8, f"the warm start should be right part of the time, got {before}"
    assert rose(before, after), f"validation accuracy did not rise: {before} -> {after}"
    rewards = [m["reward/mean"] for m in read_metrics(out) if "reward/mean" in m]
    assert sum(rewards[-5:]) > sum(rewards[:5]), rewards
    assert all("actor/kl_loss" in m for m in read_metrics(out) if "reward/mean" in m)
    # the sample tables (steps 1, 10, 20) name each sample's picture as the model saw it
    table = json.loads((out / "samples" / "step_20.json").read_text())
    images = [row[table["columns"].index("images")] for row in table["data"]]
    assert images == [[f"samples/step_20/{i}_0.png"] for i in range(4)]
    for (path,) in images:
        with Image.open(out / path) as shown:
            assert shown.size == (56, 56)


def test_a_broken_picture_fails_the_run_before_its_first_step_naming_the_record(tmp_path,
                                                                                tiny_cache):
    folder = tmp_path / "data"
    folder.mkdir()
    good = io.BytesIO()
    Image.new("RGB", (56, 56), (200, 10, 10)).save(good, format="PNG")
    (folder / "red.png").write_bytes(good.getvalue())
    (folder / "cut.png").write_bytes(good.getvalue()[:50])
    rows = [{"prompt": "How many squares?", "answer": "1", "pictures": ["red.png"]}] * 3 + [
        {"prompt": "How many squares?", "answer": "1", "pictures": ["cut.png"]}]
    train = write_rows(rows, folder / "train.jsonl")
    spec = counting_spec(tmp_path / "out", 1)
    spec["model"] = {"path": "tiny:vl"}
    spec["data"] = {"train_files": [str(train)], "image_key": "pictures",
                    "train_batch_size": 4, "prompt_template": "chat"}
    spec["trainer"]["eval_every"] = 0
    spec["actor"] = {**spec["actor"], "ppo_mini_batch_size": 4, "ppo_micro_batch_size": 32}
    with pytest.raises(DataError, match=rf"training data: 1 image problem\(s\): {train} line 4: "
                                        r"image 0: .*cut.png is not a readable image"):
        RLTrainer(resolve_spec(spec)).fit()
    assert not (tmp_path / "out" / "metrics.jsonl").exists() or not read_metrics(tmp_path / "out")
