"""`tools.precision` on real runs of the tiny GRPO example: the dumps go where the docs say and to
MLflow; a run with one layer perturbed (the test hook) is found diverging first at that layer
and stage, by `compare` and by `python -m rl_core precision compare`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from test_trainer import tiny_spec

from rl_core.precision import PERTURB_ENV, compare
from rl_core.recipes.rl import RLTrainer
from rl_core.spec import resolve_spec
from rl_core.tracking import make_tracker

ROOT = Path(__file__).resolve().parents[2]
LAYER = "model.layers.1.mlp"  # the tiny model's second (last) decoder layer's MLP


def dumped(out: Path, **tracker) -> RLTrainer:
    spec = resolve_spec(tiny_spec(out, trainer={"total_steps": 1, "deterministic": True},
                                  tools={"precision": {"enable": True, "steps": [1]}}))
    trainer = RLTrainer(spec, **tracker)
    trainer.fit()
    return trainer


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, tiny_cache):
    out = tmp_path_factory.mktemp("reference") / "run"
    dumped(out)
    return out


def test_a_dumped_step_holds_each_stages_data_and_modules_in_mlflow(tmp_path, tiny_cache,
                                                                    mlflow_server):
    out = tmp_path / "run"
    tracker = make_tracker(resolve_spec(tiny_spec(out)), out,
                           environ={"MLFLOW_TRACKING_URI": mlflow_server})
    dumped(out, tracker=tracker)
    step = out / "precision" / "step_1"
    data = {p.parent.name for p in (step / "controller-rank0").glob("*/data.json")}
    assert data == {"rollout", "reward", "ref_logprob", "old_logprob", "advantages", "update"}
    rollout = json.loads((step / "controller-rank0" / "rollout" / "data.json").read_text())
    assert {"prompt_ids", "response_ids", "logprobs"} <= set(rollout["tensors"])
    modules = {p.parent.relative_to(step).as_posix() for p in step.glob("*/*/dump.json")}
    assert modules == {"actor-rank0/old_logprob", "actor-rank0/update",
                       "reference-rank0/ref_logprob"}
    update = json.loads((step / "actor-rank0" / "update" / "dump.json").read_text())["data"]
    assert any(".backward." in name for name in update)  # gradients as well as forwards
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    files = sorted(p for p in step.rglob("*") if p.is_file())
    assert metrics[0]["precision/files"] == len(files)
    client = MlflowClient(mlflow_server)
    listed = {f.path for f in client.list_artifacts(tracker.mlflow_run_id,
                                                     "precision/step_1/actor-rank0/update")}
    assert "precision/step_1/actor-rank0/update/dump.json" in listed


def test_a_perturbed_layer_is_found_first_at_that_layer_and_stage(tmp_path, tiny_cache,
                                                                  reference_run, monkeypatch):
    out = tmp_path / "perturbed"
    monkeypatch.setenv(PERTURB_ENV, f"old_logprob:{LAYER}=0.05")
    dumped(out)
    made = compare(reference_run / "precision", out / "precision")
    assert made.diverged
    first = made.first_divergence
    assert first["stage"] == "old_logprob" and LAYER in first["module"], first
    assert first["worker"] == "actor-rank0"
    # everything before it agrees: the rollout, rewards, reference, and the layers below
    before = [r for r in made.rows if r["order"] < first["order"]]
    assert before and all(r["status"] != "diverged" for r in before)
    assert any("layers.0." in r["module"] and r["stage"] == "old_logprob" for r in before)
    assert "first divergence" in made.summary() and "old_logprob" in made.summary()


def test_the_command_line_compare_says_where_and_exits_by_the_outcome(tmp_path, tiny_cache,
                                                                      reference_run):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rl_core", "precision", "compare", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)

    same = run(str(reference_run / "precision"), str(reference_run / "precision"),
               "--out", str(tmp_path / "same"))
    assert same.returncode == 0, same.stderr
    assert "no divergence" in same.stdout
    report = json.loads((tmp_path / "same" / "report.json").read_text())
    assert report["first_divergence"] is None and (tmp_path / "same" / "report.csv").is_file()
    missing = run(str(reference_run / "precision"), str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "nowhere" in missing.stderr


@pytest.mark.parametrize("sections, field", [
    ({"tools": {"precision": {"enable": True, "steps": [9]}}}, "tools.precision.steps"),
    ({"tools": {"precision": {"enable": True, "ranks": [2]}}}, "tools.precision.ranks"),
    ({"tools": {"precision": {"enable": True, "stages": ["decode"]}}}, "tools.precision.stages"),
    ({"tools": {"precision": {"enable": True, "output": "my dumps"}}}, "tools.precision.output"),
    ({"tools": {"precision": {"enable": True}}, "trainer": {"output_dir": "/tmp/a b"}},
     "trainer.output_dir"),
])
def test_a_dump_the_run_cannot_make_is_refused_naming_the_field(tmp_path, sections, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        resolve_spec(tiny_spec(tmp_path, **sections))
