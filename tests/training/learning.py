"""Helpers of the learning tests: the task, RL specs over the SFT base, the validation gain."""

from __future__ import annotations

from pathlib import Path

# The learning tests' task: one-digit addition, 80 training and 20 validation prompts.
LEARNING_DATA = {"synthetic": {"task": "addition", "digits": 1, "num_train": 80, "num_val": 20},
                 "prompt_template": "plain", "val_batch_size": 20}


def learning_spec(algorithm: str, base: Path, output_dir: Path, steps: int, **sections) -> dict:
    """An RL run on the SFT base, validated at its start and end."""
    spec = {
        "algorithm": algorithm, "seed": 1, "model": {"path": str(base)},
        "data": {**LEARNING_DATA, "train_batch_size": 16},
        "rollout": {"n_samples_per_prompt": 8, "max_new_tokens": 4},
        "actor": {"lr": 1e-4, "ppo_mini_batch_size": 16, "ppo_micro_batch_size": 64},
        "reward": {"functions": [{"name": "exact_match"}]},
        "trainer": {"total_steps": steps, "eval_every": steps, "output_dir": str(output_dir),
                    "logger": []},
    }
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values}
    return spec


def validation_gain(output_dir: Path) -> tuple[float, float]:
    """(validation accuracy before training, after), from the run's metrics file."""
    import json

    logged = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    evaluated = [m for m in logged if "val/accuracy" in m]
    assert evaluated[0]["step"] == 0, "the run must validate before its first step"
    return evaluated[0]["val/accuracy"], evaluated[-1]["val/accuracy"]


def rose(before: float, after: float, by: float = 0.1) -> bool:
    """Whether accuracy rose by at least `by`: accuracies are float32 counts over the validation
    set (13/20 is logged as 0.6499999...), so a gain of exactly `by` must count."""
    return after - before >= by - 1e-6
