"""The MLflow adapter against a real tracking server (PostgreSQL store under `make test`)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from experiments.mlflow_store import Tracking, TrackingError, downsample


@pytest.fixture(scope="module")
def tracking(mlflow_server) -> Tracking:
    return Tracking(mlflow_server)


@pytest.fixture(scope="module")
def run(tracking) -> tuple[str, str]:
    """(experiment id, run id) of a run that logged like a training process: 100 steps of
    reward/mean, 2 of actor/pg_loss, and a checkpoint file."""
    experiment = tracking.ensure_experiment(f"adapter-{uuid.uuid4().hex[:8]}")
    run_id = tracking.create_run(experiment, "run 7", tags={"ascent.attempt": "1"})
    client = MlflowClient(tracking.uri)
    now = int(time.time() * 1000)
    rewards = [Metric("reward/mean", step / 100, now + step, step) for step in range(100)]
    losses = [Metric("actor/pg_loss", -value, now, step) for step, value in ((1, 0.5), (2, 0.25))]
    client.log_batch(run_id, metrics=rewards + losses)
    client.log_text(run_id, "{}", "checkpoints/step_3/config.json")
    return experiment, run_id


def test_ensure_experiment_is_idempotent(tracking):
    name = f"exp-{uuid.uuid4().hex[:8]}"

    first = tracking.ensure_experiment(name, tags={"ascent.project": "p1"})
    second = tracking.ensure_experiment(name, tags={"ascent.project": "p1", "ascent.owner": "ann"})

    assert first == second
    experiment = MlflowClient(tracking.uri).get_experiment(first)
    assert experiment.name == name
    assert {"ascent.project": "p1", "ascent.owner": "ann"}.items() <= experiment.tags.items()


def test_ensure_experiment_restores_one_deleted_in_mlflow(tracking):
    name = f"deleted-{uuid.uuid4().hex[:8]}"
    first = tracking.ensure_experiment(name)
    MlflowClient(tracking.uri).delete_experiment(first)

    assert tracking.ensure_experiment(name) == first
    assert MlflowClient(tracking.uri).get_experiment(first).lifecycle_stage == "active"


def test_create_run_and_terminate(tracking, run):
    experiment, run_id = run
    client = MlflowClient(tracking.uri)
    created = client.get_run(run_id)
    assert created.info.experiment_id == experiment and created.info.run_name == "run 7"
    assert created.info.status == "RUNNING" and created.data.tags["ascent.attempt"] == "1"

    other = tracking.create_run(experiment, "run 8")
    tracking.set_terminated(other, "FAILED")

    assert client.get_run(other).info.status == "FAILED"
    with pytest.raises(ValueError, match="FINISHED, FAILED, KILLED"):
        tracking.set_terminated(other, "DONE")


def test_metric_history_is_downsampled_keeping_first_and_last(tracking, run):
    _, run_id = run

    full = tracking.metric_history(run_id, "reward/mean")
    sampled = tracking.metric_history(run_id, "reward/mean", max_points=10)

    assert [step for step, _, _ in full] == list(range(100))
    assert full[3][1] == pytest.approx(0.03) and full[3][2] > full[2][2]  # (step, value, timestamp)
    assert len(sampled) == 10
    assert sampled[0] == full[0] and sampled[-1] == full[-1]
    assert [s for s, _, _ in sampled] == sorted({s for s, _, _ in sampled})
    assert tracking.metric_history(run_id, "reward/mean", max_points=500) == full


@pytest.mark.parametrize(("n", "max_points", "expected"), [
    (10, 4, [0, 3, 6, 9]),
    (10, 2, [0, 9]),
    (5, 5, [0, 1, 2, 3, 4]),
    (101, 3, [0, 50, 100]),
    (0, 3, []),
])
def test_downsample_spreads_points_evenly(n, max_points, expected):
    points = [(i, float(i), i) for i in range(n)]
    assert [step for step, _, _ in downsample(points, max_points)] == expected


def test_downsample_needs_two_points():
    with pytest.raises(ValueError, match="at least 2"):
        downsample([(0, 0.0, 0)], 1)


def test_metric_keys_and_latest_values(tracking, run):
    _, run_id = run

    assert tracking.metric_keys(run_id) == ["actor/pg_loss", "reward/mean"]
    assert tracking.latest_metrics(run_id) == {"actor/pg_loss": -0.25, "reward/mean": 0.99}


def test_artifacts_are_listed_by_folder(tracking, run):
    _, run_id = run

    assert tracking.list_artifacts(run_id) == [
        {"path": "checkpoints", "is_dir": True, "size": None}
    ]
    assert tracking.list_artifacts(run_id, "checkpoints/step_3") == [
        {"path": "checkpoints/step_3/config.json", "is_dir": False, "size": 2}
    ]


def test_a_json_artifact_is_read_back_and_a_missing_one_is_none(tracking, run, tmp_path):
    _, run_id = run
    MlflowClient(tracking.uri).log_dict(run_id, {"seed": 7, "processes": [1, 2]},
                                        "determinism/report.json")

    assert tracking.read_json(run_id, "determinism/report.json") == {"seed": 7, "processes": [1, 2]}
    assert tracking.read_json(run_id, "determinism/other.json") is None
    assert tracking.read_json(run_id, "nowhere/report.json") is None
    copied = tracking.download(run_id, "checkpoints", tmp_path)
    assert (Path(copied) / "step_3" / "config.json").read_text() == "{}"


def test_run_url_links_the_mlflow_ui(tracking, run, mlflow_server):
    experiment, run_id = run

    assert tracking.run_url(run_id) == f"{mlflow_server}/#/experiments/{experiment}/runs/{run_id}"


def test_an_unknown_run_is_a_tracking_error(tracking):
    with pytest.raises(TrackingError) as caught:
        tracking.latest_metrics("0" * 32)

    assert str(caught.value).startswith(f"the MLflow server at {tracking.uri} did not return run")


def test_an_unreachable_server_is_a_tracking_error_quickly(unused_address):
    started = time.monotonic()

    with pytest.raises(TrackingError) as caught:
        Tracking(unused_address, timeout_s=2).ensure_experiment("anything")

    assert str(caught.value).startswith(
        f"cannot reach the MLflow server at {unused_address}: connection refused")
    assert time.monotonic() - started < 15


def test_the_store_is_postgresql_when_the_environment_provides_it(mlflow_store, run):
    if not mlflow_store.startswith("postgresql"):
        pytest.skip("DATABASE_URL is not PostgreSQL: the server runs on SQLite")
    import psycopg

    _, run_id = run
    dsn = mlflow_store.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT name FROM runs WHERE run_uuid = %s", (run_id,)).fetchone()
    assert row == ("run 7",)


def test_set_tags_overwrites_in_one_call(tracking, run):
    _, run_id = run

    tracking.set_tags(run_id, {"mlflow.note.content": "first", "ascent.tags": "a"})
    tracking.set_tags(run_id, {"mlflow.note.content": "second", "ascent.tags": ""})

    tags = MlflowClient(tracking.uri).get_run(run_id).data.tags
    assert (tags["mlflow.note.content"], tags["ascent.tags"]) == ("second", "")


@pytest.mark.django_db
def test_a_runs_note_and_tags_reach_its_mlflow_run(mlflow_server, settings, django_user_model):
    """At creation (ensure_tracking) and after an edit (sync_notes, the sync_run_notes task)."""
    from accounts.models import Project
    from experiments.models import Experiment, Run
    from experiments.services import annotate_run
    from workers.dispatch import ensure_tracking, sync_notes

    settings.MLFLOW_TRACKING_URI = mlflow_server
    project = Project.objects.create(name=f"notes-{uuid.uuid4().hex[:6]}")
    experiment = Experiment.objects.create(project=project, name="e")
    run = Run.objects.create(experiment=experiment, spec={}, algorithm="grpo", device_type="cpu",
                             device_count=1, note="why this run")
    annotate_run(run, tags=["baseline", "paper"])

    mlflow_run_id = ensure_tracking(run)
    tags = MlflowClient(mlflow_server).get_run(mlflow_run_id).data.tags
    assert (tags["mlflow.note.content"], tags["ascent.tags"]) == ("why this run", "baseline, paper")

    run.refresh_from_db()
    annotate_run(run, tags=["final"], note="what it showed")
    sync_notes(run.pk)
    tags = MlflowClient(mlflow_server).get_run(mlflow_run_id).data.tags
    assert (tags["mlflow.note.content"], tags["ascent.tags"]) == ("what it showed", "final")
