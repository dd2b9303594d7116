"""`tools.profiling`: traces of the chosen steps, stages and ranks, written where the docs say,
readable as the profiler's Chrome traces, in MLflow; nothing traced elsewhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from test_trainer import read_metrics, tiny_spec

from rl_core.recipes.rl import RLTrainer
from rl_core.spec import resolve_spec
from rl_core.tracking import make_tracker


def trace_events(path: Path) -> list[dict]:
    """The events of a trace as the profiler exported it (Chrome trace format)."""
    trace = json.loads(path.read_text())
    assert trace["traceEvents"], path
    return trace["traceEvents"]


def test_a_profiled_ppo_step_traces_each_stage_of_each_role_once(tmp_path, tiny_cache,
                                                                  mlflow_server):
    out = tmp_path / "run"
    spec = resolve_spec(tiny_spec(
        out, algorithm="ppo", critic={"enable": True}, advantage={"adv_estimator": "gae"},
        reference={"enable": True}, actor={"use_kl_loss": True},
        trainer={"total_steps": 3}, tools={"profiling": {"enable": True, "steps": [2]}}))
    tracker = make_tracker(spec, out, environ={"MLFLOW_TRACKING_URI": mlflow_server})
    RLTrainer(spec, tracker=tracker).fit()

    profiles = out / "profiles"
    assert [p.name for p in profiles.iterdir()] == ["step_2"]  # no other step traced
    traces = sorted(p.name for p in (profiles / "step_2").iterdir())
    assert traces == sorted([
        "actor-rank0-rollout.json", "actor-rank0-old_logprob.json", "actor-rank0-update.json",
        "reference-rank0-ref_logprob.json", "critic-rank0-values.json",
        "critic-rank0-update.json", "reward-rank0-reward.json",
    ])
    for name in traces:
        role, _, stage = name.removesuffix(".json").split("-")
        events = trace_events(profiles / "step_2" / name)
        labels = {e.get("name") for e in events}
        assert f"rl_core/{role}/{stage}" in labels, name
        if stage in ("update", "values", "old_logprob", "ref_logprob"):
            assert any(str(label).startswith("aten::") for label in labels), name

    metrics = {m["step"]: m for m in read_metrics(out)}
    assert metrics[2]["profile/traces"] == len(traces)
    assert "profile/traces" not in metrics[1] and "profile/traces" not in metrics[3]
    client = MlflowClient(mlflow_server)
    listed = {f.path for f in client.list_artifacts(tracker.mlflow_run_id, "profiles/step_2")}
    assert listed == {f"profiles/step_2/{name}" for name in traces}


def test_chosen_stages_ranks_and_detail_on_two_ray_ranks(tmp_path, tiny_cache, local_ray):
    """ranks [1], stages [update, rollout], level1 (shapes): the second rank's traces only."""
    out = tmp_path / "run"
    spec = resolve_spec(tiny_spec(
        out, trainer={"total_steps": 1}, resources={"devices_per_node": 2},
        tools={"profiling": {"enable": True, "steps": [1], "ranks": [1],
                             "stages": ["update", "rollout"], "level": "level1"}}))
    RLTrainer(spec, backend="ray").fit()
    folder = out / "profiles" / "step_1"
    assert sorted(p.name for p in folder.iterdir()) == [
        "actor-rank1-rollout.json", "actor-rank1-update.json"]
    shaped = [e for e in trace_events(folder / "actor-rank1-update.json")
              if e.get("name") == "aten::mm"]
    assert shaped and all("Input Dims" in e.get("args", {}) for e in shaped)


@pytest.mark.parametrize("profiling, field", [
    ({"steps": [7]}, "tools.profiling.steps"),
    ({"ranks": [1]}, "tools.profiling.ranks"),
    ({"stages": ["decode"]}, "tools.profiling.stages"),
])
def test_profiling_outside_the_run_is_refused_naming_the_field(tmp_path, profiling, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        resolve_spec(tiny_spec(tmp_path, tools={"profiling": {"enable": True, **profiling}}))
