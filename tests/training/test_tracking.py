"""Tracking: the local metrics file always, a real MLflow server when MLFLOW_TRACKING_URI is set."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from rl_core.spec import resolve_spec
from rl_core.tracking import make_tracker

SPEC = {"algorithm": "grpo", "name": "tracked", "data": {"synthetic": {"task": "addition"}},
        "reward": {"functions": [{"name": "exact_match"}]}}


def test_without_mlflow_metrics_go_to_a_local_file(tmp_path):
    tracker = make_tracker(resolve_spec(SPEC), tmp_path, environ={})
    tracker.log_params({"a": "1"})
    tracker.log_metrics({"reward/mean": 0.5}, step=1)
    tracker.log_metrics({"reward/mean": 0.75}, step=2)
    tracker.finish()
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.75}]
    assert tracker.mlflow_run_id is None


def test_it_logs_params_metrics_and_artifacts_to_mlflow(tmp_path, mlflow_server):
    spec = resolve_spec(SPEC)
    tracker = make_tracker(spec, tmp_path, environ={"MLFLOW_TRACKING_URI": mlflow_server})
    tracker.log_params(spec.flat_params())
    for step in (1, 2, 3):
        tracker.log_metrics({"reward/mean": step / 4, "actor/pg_loss": float("nan")}, step=step)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    tracker.log_artifacts(tmp_path / "ckpt", "checkpoints/step_3")
    tracker.finish("FINISHED")

    client = MlflowClient(mlflow_server)
    run = client.get_run(tracker.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert run.data.params["actor.clip_ratio_high"] == "0.2"
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert "actor/pg_loss" not in run.data.metrics  # non-finite values are not sent
    listed = [f.path for f in client.list_artifacts(run.info.run_id, "checkpoints/step_3")]
    assert listed == ["checkpoints/step_3/config.json"]


def test_it_logs_into_a_run_the_platform_created(tmp_path, mlflow_server):
    client = MlflowClient(mlflow_server)
    experiment = client.create_experiment("platform-made")
    created = client.create_run(experiment, run_name="run 7").info.run_id
    env = {"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_RUN_ID": created}
    spec = resolve_spec(SPEC)
    for attempt in (1, 2):  # a restarted attempt logs the same params again without failing
        tracker = make_tracker(spec, tmp_path / str(attempt), environ=env)
        assert tracker.mlflow_run_id == created
        tracker.log_params(spec.flat_params())
        tracker.log_metrics({"reward/mean": 1.0}, step=attempt)
        tracker.finish()
    assert len(client.get_metric_history(created, "reward/mean")) == 2


def test_rollout_samples_are_tables_in_the_output_folder_and_in_mlflow(tmp_path, mlflow_server,
                                                                        monkeypatch, tiny_cache):
    from rl_core.recipes.rl import RLTrainer

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    spec = resolve_spec({
        **SPEC, "model": {"path": "tiny:nano"},
        "data": {"synthetic": {"task": "addition", "digits": 1, "num_train": 16, "num_val": 0},
                 "train_batch_size": 4, "prompt_template": "plain"},
        "rollout": {"n_samples_per_prompt": 2, "max_new_tokens": 3},
        "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 8},
        "trainer": {"total_steps": 3, "output_dir": str(tmp_path), "logger": []},
        "tools": {"monitor": {"sample_every": 2, "num_samples": 3}}})
    trainer = RLTrainer(spec)
    trainer.fit()
    # the first step and every second one; three prompts each, the first response of each
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["step_1.json", "step_2.json"]
    table = json.loads((tmp_path / "samples" / "step_2.json").read_text())
    assert table["columns"] == ["prompt", "response", "reward", "response_tokens",
                                "reward/exact_match"]
    assert len(table["data"]) == 3 and all(row[0].endswith("=") for row in table["data"])
    assert all(row[2] in (0.0, 1.0) and 1 <= row[3] <= 3 for row in table["data"])
    client = MlflowClient(mlflow_server)
    run_id = trainer.ctl.tracker.mlflow_run_id
    logged = [a.path for a in client.list_artifacts(run_id, "samples")]
    assert logged == ["samples/step_1.json", "samples/step_2.json"]
    assert json.loads(open(client.download_artifacts(run_id, "samples/step_2.json")).read()) == table


def _system_keys(client, run_id):
    return sorted(k for k in client.get_run(run_id).data.metrics if k.startswith("system/"))


def _sampler_threads():
    import threading

    return [t for t in threading.enumerate() if t.name == "SystemMetricsMonitor" and t.is_alive()]


def test_the_nodes_resources_are_sampled_into_the_mlflow_run(tmp_path, mlflow_server, monkeypatch):
    import time

    # the spec's interval and the documented keys win over MLflow's own variables
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "30")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", "5")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_NODE_ID", "node_0")
    spec = resolve_spec({**SPEC, "tools": {"monitor": {"system_metrics_interval": 0.2}}})
    tracker = make_tracker(spec, tmp_path, environ={"MLFLOW_TRACKING_URI": mlflow_server})
    assert len(_sampler_threads()) == 1
    time.sleep(1.5)
    tracker.finish()

    assert _sampler_threads() == []  # stopped with the tracker
    client = MlflowClient(mlflow_server)
    run_id = tracker.mlflow_run_id
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_percentage",
            "system/system_memory_usage_megabytes"} <= set(_system_keys(client, run_id))
    for key in ("system/cpu_utilization_percentage", "system/system_memory_usage_percentage"):
        history = client.get_metric_history(run_id, key)
        assert len(history) >= 3, history
        assert all(0 <= m.value <= 100 for m in history), history
    memory = client.get_metric_history(run_id, "system/system_memory_usage_megabytes")
    assert all(m.value > 10 for m in memory)  # this process alone holds more than 10 MB


def test_a_run_shorter_than_the_interval_still_gets_its_sample(tmp_path, mlflow_server):
    spec = resolve_spec({**SPEC, "tools": {"monitor": {"system_metrics_interval": 30}}})
    tracker = make_tracker(spec, tmp_path, environ={"MLFLOW_TRACKING_URI": mlflow_server})
    tracker.log_metrics({"reward/mean": 1.0}, step=1)
    tracker.finish()

    history = MlflowClient(mlflow_server).get_metric_history(
        tracker.mlflow_run_id, "system/cpu_utilization_percentage")
    assert [m.step for m in history] == [0]
    assert _sampler_threads() == []


def test_no_resources_are_sampled_at_interval_0(tmp_path, mlflow_server):
    spec = resolve_spec({**SPEC, "tools": {"monitor": {"system_metrics_interval": 0}}})
    tracker = make_tracker(spec, tmp_path, environ={"MLFLOW_TRACKING_URI": mlflow_server})
    tracker.log_metrics({"reward/mean": 1.0}, step=1)
    assert _sampler_threads() == []
    tracker.finish()
    assert _system_keys(MlflowClient(mlflow_server), tracker.mlflow_run_id) == []


def test_a_restarted_attempt_continues_the_samples_steps(tmp_path, mlflow_server):
    import time

    client = MlflowClient(mlflow_server)
    created = client.create_run(client.create_experiment("sampled-restart")).info.run_id
    env = {"MLFLOW_TRACKING_URI": mlflow_server, "MLFLOW_RUN_ID": created}
    spec = resolve_spec({**SPEC, "tools": {"monitor": {"system_metrics_interval": 0.2}}})
    steps = []
    for attempt in (1, 2):
        tracker = make_tracker(spec, tmp_path / str(attempt), environ=env)
        time.sleep(1.0)
        tracker.finish("FAILED" if attempt == 1 else "FINISHED")
        steps.append([m.step for m in client.get_metric_history(created, "system/cpu_utilization_percentage")])
    first, both = steps
    assert first and len(both) > len(first)
    assert sorted(both) == list(range(len(both)))  # the second attempt's steps follow the first's


def test_a_refused_resume_ends_the_run_and_its_sampling(tmp_path, mlflow_server, monkeypatch,
                                                         tiny_cache):
    from rl_core.errors import InputError
    from rl_core.recipes.rl import RLTrainer

    def spec(split: int):
        return resolve_spec({
            **SPEC, "model": {"path": "tiny:nano"},
            "data": {"synthetic": {"task": "addition", "digits": 1, "num_train": 8, "num_val": 0},
                     "train_batch_size": 4, "prompt_template": "plain"},
            "rollout": {"n_samples_per_prompt": 2, "max_new_tokens": 6,
                        "partial_rollout_max_split": split},
            "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size": 8},
            "trainer": {"total_steps": 1, "output_dir": str(tmp_path), "logger": []},
            "tools": {"monitor": {"system_metrics_interval": 0.2}}})

    RLTrainer(spec(3)).fit()  # a checkpoint with partial rollout in 3 pieces (no MLflow)
    client = MlflowClient(mlflow_server)
    created = client.create_run(client.create_experiment("refused-resume")).info.run_id
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("MLFLOW_RUN_ID", created)
    with pytest.raises(InputError, match="rollout.partial_rollout_max_split"):
        RLTrainer(spec(2))  # refused once the checkpoint is read, after the tracker started
    assert _sampler_threads() == []
    assert client.get_run(created).info.status == "FAILED"
