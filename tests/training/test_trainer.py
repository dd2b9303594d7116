"""The RL trainer on a tiny model: it updates, resumes exactly, and reports through MLflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from rl_core import stopping
from rl_core.checkpoint import list_checkpoints
from rl_core.errors import InputError
from rl_core.recipes.rl import RLTrainer
from rl_core.spec import resolve_spec
from rl_core.tracking import stable_metrics

ROOT = Path(__file__).resolve().parents[2]


def tiny_spec(output_dir: Path, **sections) -> dict:
    spec = {
        "algorithm": "grpo",
        "seed": 7,
        "model": {"path": "tiny:nano"},
        "data": {"synthetic": {"task": "addition", "digits": 1, "num_train": 16, "num_val": 8},
                 "prompt_template": "plain", "train_batch_size": 4, "val_batch_size": 8},
        "rollout": {"n_samples_per_prompt": 4, "max_new_tokens": 4},
        "actor": {"lr": 1e-3, "lr_scheduler": "cosine", "ppo_mini_batch_size": 2,
                  "ppo_micro_batch_size": 4, "ppo_epochs": 2},
        "reward": {"functions": [{"name": "exact_match"}, {"name": "format_lenient", "weight": 0.1}]},
        "trainer": {"total_steps": 6, "output_dir": str(output_dir)},
    }
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values} if isinstance(values, dict) else values
    return spec


def read_metrics(output_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_step_changes_the_parameters(tmp_path, tiny_cache):
    trainer = RLTrainer(resolve_spec(tiny_spec(tmp_path, trainer={"total_steps": 1})))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.train_step()
    changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "no parameter changed"
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm",
                "reward/mean", "response_length/mean", "timing/rollout", "perf/tokens_per_s"):
        assert key in metrics, key


def test_resume_is_exact_across_an_epoch_boundary(tmp_path, tiny_cache):
    # 16 prompts in batches of 4: an epoch is 4 steps, so steps 4 -> 5 cross into the next one.
    straight = RLTrainer(resolve_spec(tiny_spec(tmp_path / "straight")))
    straight.fit()

    # A stop asked during step 3 (SIGTERM: rl_core.stopping) lets the step end, saves it and
    # stops the run; the process "dies" there and a new trainer resumes from step 3.
    interrupted = RLTrainer(resolve_spec(tiny_spec(tmp_path / "resumed")))
    step = interrupted.train_step

    def stop_during_step_3():
        if interrupted.step == 2:
            stopping.request()
        return step()

    interrupted.train_step = stop_during_step_3
    with pytest.raises(stopping.Stopped, match="stopped at step 3: checkpoint .*step_3 saved"):
        interrupted.fit()
    stopping.clear()
    del interrupted

    resumed = RLTrainer(resolve_spec(tiny_spec(tmp_path / "resumed")))
    assert resumed.step == 3
    resumed.fit()

    a, b = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert [m["step"] for m in a] == [m["step"] for m in b] == [1, 2, 3, 4, 5, 6]
    for left, right in zip(a, b):
        assert stable_metrics(left) == pytest.approx(stable_metrics(right), abs=1e-6), left["step"]
    for key, value in straight.model.state_dict().items():
        assert torch.allclose(value, resumed.model.state_dict()[key], atol=1e-6), key
    assert [step for step, _ in list_checkpoints(tmp_path / "resumed")] == [3, 6]


def test_a_partial_checkpoint_is_ignored(tmp_path, tiny_cache):
    spec = resolve_spec(tiny_spec(tmp_path, trainer={"total_steps": 1}))
    (tmp_path / "checkpoints" / ".tmp-step_9").mkdir(parents=True)
    trainer = RLTrainer(spec)
    assert trainer.step == 0 and not (tmp_path / "checkpoints" / ".tmp-step_9").exists()
    trainer.close()


def test_it_tracks_to_a_real_mlflow_server(tmp_path, tiny_cache, mlflow_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    spec = resolve_spec(tiny_spec(tmp_path, trainer={"total_steps": 2, "eval_every": 2,
                                                     "experiment_name": "trainer-test"},
                                  name="tracked-run"))
    trainer = RLTrainer(spec)
    trainer.fit()
    client = MlflowClient(mlflow_server)
    run = client.get_run(trainer.tracker.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.n_samples_per_prompt"] == "4"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")] == [1, 2]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/accuracy")] == [0, 2]
    files = {f.path for f in client.list_artifacts(run.info.run_id, "checkpoints/step_2")}
    assert "checkpoints/step_2/model.safetensors" in files


def test_the_algorithm_must_be_one_this_trainer_runs(tmp_path):
    spec = resolve_spec({**tiny_spec(tmp_path), "algorithm": "dpo",
                         "data": {"train_files": ["x.jsonl"], "chosen_key": "c", "rejected_key": "r"},
                         "reward": {"functions": []}})
    with pytest.raises(InputError, match="dpo"):
        RLTrainer(spec)


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "rl_core", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def write_spec(tmp_path: Path, spec: dict) -> Path:
    import yaml

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_command_exits_2_on_a_spec_error_with_the_reason_last(tmp_path, tiny_cache):
    path = write_spec(tmp_path, tiny_spec(tmp_path / "out"))
    result = cli("train", str(path), "actor.clip_ratio_low=0.9", cwd=tmp_path)
    assert result.returncode == 2
    assert "actor.clip_ratio_low" in result.stderr.strip().splitlines()[-1]


def test_the_command_exits_2_on_a_missing_model_folder(tmp_path):
    path = write_spec(tmp_path, tiny_spec(tmp_path / "out", model={"path": str(tmp_path / "nowhere")}))
    result = cli("train", str(path), cwd=tmp_path)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: invalid input") and "nowhere" in last


def test_the_command_trains_and_exits_0(tmp_path, tiny_cache):
    path = write_spec(tmp_path, tiny_spec(tmp_path / "out", trainer={"total_steps": 2}))
    result = cli("train", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert {"actor/loss", "reward/mean", "timing/step"} <= set(summary)
    assert (tmp_path / "out" / "checkpoints" / "step_2" / "model.safetensors").is_file()


def test_a_non_finite_loss_stops_the_run_with_its_step_and_writes_nothing(tmp_path, tiny_cache):
    from rl_core.errors import TrainingStopped

    trainer = RLTrainer(resolve_spec(tiny_spec(tmp_path, trainer={"total_steps": 3})))
    actor = trainer.roles.actor.workers[0]
    inner = actor.loss_fn
    actor.loss_fn = lambda mb, logprobs, entropy: (inner(mb, logprobs, entropy)[0] * float("nan"), {})
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(TrainingStopped, match="stopped at step 1: non-finite loss") as info:
        trainer.fit()
    assert info.value.step == 1 and "actor/loss" in info.value.metrics
    assert all(torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())
    assert list_checkpoints(tmp_path) == []


@pytest.mark.parametrize(("section", "message"), [
    ({"model": {"path": "tiny:nano", "dtype": "float16"}}, "model.dtype: float16 cannot train on cpu"),
    ({"resources": {"device_type": "gpu"}}, "resources.device_type=gpu asks for 1 GPU"),
])
def test_a_dtype_or_device_this_host_cannot_train_on_is_refused_before_loading(tmp_path, section, message):
    spec = resolve_spec(tiny_spec(tmp_path / "missing-output", **section))
    with pytest.raises(InputError, match=message):
        RLTrainer(spec)
    assert not (tmp_path / "missing-output").exists()


# DAPO's overlong penalty makes a random model's rewards differ within groups (real gradients)
ALGORITHMS = {
    "dapo": {"algorithm": "dapo", "advantage": {
        "overlong_buffer": {"enable": True, "len": 2, "penalty_factor": 1.0},
        "dynamic_sampling": {"enable": False}}},
    "ppo": {"algorithm": "ppo", "critic": {"enable": True}, "advantage": {"adv_estimator": "gae"}},
}


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_packed_token_budget_runs_equal_padded_runs(tmp_path, tiny_cache, algorithm):
    """Remove padding and a Karmarkar–Karp token budget in every role (actor, reference, critic)
    change how the work is laid out, not the run: the same metrics."""
    common = {"trainer": {"total_steps": 3}, "data": {"max_prompt_length": 16},
              **ALGORITHMS[algorithm]}
    packed = {"use_remove_padding": True, "use_dynamic_bsz": True, "max_token_len_per_gpu": 40}
    for name, actor in (("padded", {}), ("packed", packed)):
        RLTrainer(resolve_spec(tiny_spec(tmp_path / name, actor=actor, **common))).fit()
    padded, packed_run = read_metrics(tmp_path / "padded"), read_metrics(tmp_path / "packed")
    assert len(padded) == len(packed_run) == 3
    assert any(abs(m["actor/pg_loss"]) > 0 for m in padded), "the comparison needs real updates"
    for left, right in zip(padded, packed_run):
        left, right = stable_metrics(left), stable_metrics(right)
        left = {k: v for k, v in left.items() if not k.startswith(("channel/", "perf/"))}
        right = {k: v for k, v in right.items() if not k.startswith(("channel/", "perf/"))}
        assert left == pytest.approx(right, rel=1e-4, abs=1e-5), left["step"]
