"""Dispatch end to end, with real processes: the API (in this process), PostgreSQL, a Celery
worker process with beat on Redis, a Ray head and an MLflow server on PostgreSQL.

A run submitted through the API is placed, launched as a Ray job (`python -m rl_core train`),
watched, logged and tracked to SUCCEEDED; cancel, a bad model path, a killed training process, a
killed worker, a restarted worker and a preemption each end the way the platform promises.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import psutil
import pytest
from rest_framework.test import APIClient

from accounts.choices import Role
from accounts.models import Membership, Project
from clusters.models import Cluster, Node
from experiments.models import Attempt, Experiment, Run
from tests.stack import WebhookReceiver, tiny_run, wait_state

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def world(django_user_model, ray_head):
    user = django_user_model.objects.create_user("owner")
    project = Project.objects.create(name="dispatch")
    Membership.objects.create(project=project, user=user, role=Role.OWNER)
    experiment = Experiment.objects.create(project=project, name="e2e", created_by=user)
    Cluster.objects.create(name="local", device_type="cpu", ray_address=ray_head)
    client = APIClient()
    client.force_authenticate(user)
    return client, experiment


def submit(client, experiment, spec: dict, **fields) -> int:
    response = client.post("/api/v1/runs/", {"experiment": experiment.pk, "spec": spec, **fields},
                           format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def jobs_of(ray_head, token, run_id: int) -> list:
    from workers.ray_jobs import RayJobs

    return [j for j in RayJobs(ray_head, token=token).list()
            if j.submission_id.startswith(f"ascent-run-{run_id}-")]


# --------------------------------------------------------------------------- the happy path


def test_a_submitted_run_succeeds_with_metrics_logs_and_a_checkpoint(world, worker, mlflow_server):
    from notifications import signing
    from notifications.models import Webhook

    client, experiment = world
    receiver = WebhookReceiver()
    hook = Webhook.objects.create(project=experiment.project, name="ci", url=receiver.url,
                                  events=["run.succeeded"], allow_local=True)
    run_id = submit(client, experiment, tiny_run(2))
    run = wait_state(run_id, {"SUCCEEDED", "FAILED"}, 300, worker)
    assert run.state == "SUCCEEDED", run.error
    # The worker tells the project's webhook, signed.
    deadline = time.monotonic() + 60
    while not receiver.requests:
        assert time.monotonic() < deadline, "the webhook heard nothing"
        time.sleep(0.3)
    receiver.close()
    (sent,) = receiver.requests
    assert signing.verify(hook.secret, sent["headers"]["X-Ascent-Signature"], sent["body"])
    assert sent["headers"]["X-Ascent-Event"] == "run.succeeded"
    assert [e.to_state for e in run.events.all()] == [
        "QUEUED", "SCHEDULED", "STARTING", "RUNNING", "SUCCEEDED"] or \
        [e.to_state for e in run.events.all()] == ["QUEUED", "SCHEDULED", "STARTING", "SUCCEEDED"]
    # the probe registered the head as a CPU node
    assert Node.objects.filter(cluster__name="local", device_type="cpu", device_count__gte=1).exists()

    logs = client.get(f"/api/v1/runs/{run_id}/logs/").json()
    assert logs["attempt"] == 1 and "step 2:" in logs["text"] and logs["complete"]
    more = client.get(f"/api/v1/runs/{run_id}/logs/?offset={logs['offset']}").json()
    assert more["text"] == ""
    # the worker read the progress from the log's step lines
    shown = client.get(f"/api/v1/runs/{run_id}/").json()
    assert (shown["progress_step"], shown["planned_steps"]) == (2, 2) and shown["progress_at"]
    assert run.progress["step"] == 2 and run.progress["percent"] == 100.0

    metrics = client.get(f"/api/v1/runs/{run_id}/metrics/?keys=reward/mean&max_points=10").json()
    assert "reward/mean" in metrics["keys"] and "actor/pg_loss" in metrics["keys"]
    assert [p[0] for p in metrics["history"]["reward/mean"]] == [1, 2]
    assert metrics["mlflow_url"].startswith(mlflow_server)

    artifacts = client.get(f"/api/v1/runs/{run_id}/artifacts/").json()
    assert 2 in {a["step"] for a in artifacts}, artifacts

    from mlflow.tracking import MlflowClient

    mlflow_run = MlflowClient(mlflow_server).get_run(run.mlflow_run_id)
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["algorithm"] == "grpo"

    usage = client.get(f"/api/v1/clusters/{run.cluster_id}/utilisation/").json()
    assert usage["kinds"]["cpu"]["held"] == 0 and usage["runs"] == []


# --------------------------------------------------------------------------- endings


def test_cancel_mid_run_stops_the_ray_job(world, worker, ray_head, ray_head_token):
    client, experiment = world
    run_id = submit(client, experiment, tiny_run(400))
    wait_state(run_id, {"RUNNING"}, 300, worker)
    assert client.post(f"/api/v1/runs/{run_id}/cancel/").json()["state"] == "CANCELLING"
    run = wait_state(run_id, {"CANCELLED"}, 120, worker)
    assert run.attempts.get().ended_at is not None
    (job,) = jobs_of(ray_head, ray_head_token, run_id)
    assert job.status == "STOPPED"


def test_a_bad_model_path_fails_with_the_reason_and_is_not_retried(world, worker):
    client, experiment = world
    spec = tiny_run(2)
    spec["model"]["path"] = "/nowhere/model"
    run_id = submit(client, experiment, spec, max_restarts=2)
    run = wait_state(run_id, {"FAILED", "SUCCEEDED"}, 300, worker)
    assert run.state == "FAILED"
    assert "/nowhere/model" in run.error and "not retried" in run.error
    assert run.attempts.count() == 1 and run.attempts.get().exit_code == 2


# --------------------------------------------------------------------------- faults


def _training_process(run_id: int) -> psutil.Process | None:
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if "rl_core train spec.yaml" in cmd and (proc.info["environ"] or {}).get(
                    "ASCENT_RUN_ID") == str(run_id):
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def test_a_killed_training_process_resumes_from_its_checkpoint_as_a_new_attempt(
        world, worker, dispatch_env):
    client, experiment = world
    run_id = submit(client, experiment, tiny_run(30), max_restarts=1)
    checkpoints = Path(dispatch_env["ASCENT_RUNS_DIR"]) / f"run-{run_id}" / "checkpoints"
    deadline = time.monotonic() + 300
    while not (checkpoints.is_dir() and any(checkpoints.glob("step_*"))):
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.5)
    proc = _training_process(run_id)
    assert proc is not None
    proc.kill()
    run = wait_state(run_id, {"SUCCEEDED", "FAILED"}, 400, worker)
    assert run.state == "SUCCEEDED", run.error
    first, second = run.attempts.order_by("number")
    assert first.exit_code != 0 and second.exit_code == 0
    assert "resumed from" in "".join(second.log_chunks.values_list("text", flat=True))
    assert "RESTARTING" in [e.to_state for e in run.events.all()]


def test_a_worker_killed_during_launch_leaves_exactly_one_ray_job(
        world, worker, ray_head, ray_head_token):
    client, experiment = world
    run_id = submit(client, experiment, tiny_run(2))
    wait_state(run_id, {"SCHEDULED", "STARTING", "RUNNING"}, 120, worker)  # placed: launching
    worker.kill()
    worker.start()
    run = wait_state(run_id, {"SUCCEEDED", "FAILED"}, 300, worker)
    assert run.state == "SUCCEEDED", run.error
    assert len(jobs_of(ray_head, ray_head_token, run_id)) == 1
    assert run.attempts.count() == 1


def test_a_run_is_tracked_to_its_end_across_a_worker_restart(world, worker):
    client, experiment = world
    run_id = submit(client, experiment, tiny_run(8))
    wait_state(run_id, {"RUNNING"}, 300, worker)
    worker.stop()
    time.sleep(3)
    worker.start()
    run = wait_state(run_id, {"SUCCEEDED", "FAILED"}, 300, worker)
    assert run.state == "SUCCEEDED", run.error


def test_an_unreachable_cluster_keeps_the_run_queued_with_the_reason(
        django_user_model, dispatch_env, unused_address):
    from workers import dispatch

    user = django_user_model.objects.create_user("owner")
    project = Project.objects.create(name="offline")
    Membership.objects.create(project=project, user=user, role=Role.OWNER)
    experiment = Experiment.objects.create(project=project, name="e", created_by=user)
    cluster = Cluster.objects.create(name="gone", device_type="cpu", ray_address=unused_address)
    Node.objects.create(cluster=cluster, hostname="n1", device_type="cpu", device_count=4,
                        healthy_device_count=4)
    client = APIClient()
    client.force_authenticate(user)
    run_id = submit(client, experiment, tiny_run(2))

    assert dispatch.schedule() == [run_id]
    assert dispatch.launch(run_id) is None
    run = Run.objects.get(pk=run_id)
    assert run.state == "QUEUED"
    assert run.waiting_reason.startswith("cluster gone: cannot reach the Ray cluster at")
    assert run.attempts.get().exit_message.startswith("not launched:")

    dispatch.probe(cluster.pk)  # the probe marks it offline: the queue says why
    dispatch.schedule()
    run.refresh_from_db()
    assert run.state == "QUEUED" and run.waiting_reason.startswith("cluster gone is offline")


# --------------------------------------------------------------------------- reconcile and probe


def _running_run(experiment, cluster, user, *, launched: bool = True, max_restarts: int = 0) -> Run:
    """A run the database believes RUNNING on `cluster` with one open attempt."""
    from django.utils import timezone

    run = Run.objects.create(experiment=experiment, spec=tiny_run(2), algorithm="grpo",
                             state="RUNNING", device_type="cpu", device_count=1, cluster=cluster,
                             created_by=user, max_restarts=max_restarts)
    Attempt.objects.create(run=run, number=1, cluster=cluster, device_count=1,
                           ray_submission_id=Attempt.submission_id(run.pk, 1),
                           launched_at=timezone.now() if launched else None)
    return run


def test_a_job_the_cluster_forgot_fails_the_run_or_restarts_it(world, dispatch_env):
    from workers import dispatch

    _, experiment = world
    cluster = Cluster.objects.get(name="local")
    lost = _running_run(experiment, cluster, experiment.created_by)
    assert dispatch.watch(lost.pk) is False
    lost.refresh_from_db()
    assert lost.state == "FAILED" and "the Ray job vanished" in lost.error

    retried = _running_run(experiment, cluster, experiment.created_by, max_restarts=1)
    assert dispatch.watch(retried.pk) is True  # a new attempt to launch
    retried.refresh_from_db()
    assert retried.state == "SCHEDULED" and retried.attempts.count() == 2


def test_reconcile_ends_runs_not_heard_of_for_too_long(world, settings):
    from datetime import timedelta

    from django.utils import timezone

    from workers import dispatch

    _, experiment = world
    cluster = Cluster.objects.get(name="local")
    silent = _running_run(experiment, cluster, experiment.created_by)
    fresh = _running_run(experiment, cluster, experiment.created_by)
    Attempt.objects.filter(run=silent).update(last_seen_at=timezone.now() - timedelta(hours=1))
    Attempt.objects.filter(run=fresh).update(last_seen_at=timezone.now())
    settings.ASCENT_SILENCE_LIMIT_S = 600
    dispatch.reconcile()
    silent.refresh_from_db()
    fresh.refresh_from_db()
    assert silent.state == "FAILED" and silent.error.startswith("no news of Ray job")
    assert fresh.state == "RUNNING"


def test_the_probe_tracks_nodes_down_and_back(world, dispatch_env):
    from workers import dispatch

    cluster = Cluster.objects.get(name="local")
    dispatch.probe(cluster.pk)
    node = Node.objects.get(cluster=cluster)
    assert node.state == "ready" and node.device_type == "cpu" and node.device_count == 2
    cluster.refresh_from_db()
    assert cluster.status == "online" and cluster.last_probe_at is not None
    Node.objects.filter(pk=node.pk).update(state="down", healthy_device_count=0)
    dispatch.probe(cluster.pk)  # the node answers again: back to READY
    node.refresh_from_db()
    assert node.state == "ready" and node.healthy_device_count == 2
    Node.objects.filter(pk=node.pk).update(state="draining")
    dispatch.probe(cluster.pk)  # a drained node stays drained
    node.refresh_from_db()
    assert node.state == "draining"


# --------------------------------------------------------------------------- preemption


def test_an_urgent_run_preempts_one_that_saves_its_step_and_resumes_exactly(
        world, worker, dispatch_env, tmp_path, django_user_model):
    import json

    import torch

    from rl_core.recipes.rl import RLTrainer
    from rl_core.spec import resolve_spec
    from rl_core.tracking import stable_metrics

    client, experiment = world
    steps = 200  # about 15 s of steps: the preemption lands in the middle
    spec = tiny_run(steps, save_every=0, deterministic=True)
    victim = submit(client, experiment, spec)
    deadline = time.monotonic() + 300
    while (Run.objects.get(pk=victim).progress_step or 0) < 2:
        assert time.monotonic() < deadline, "the run logged no second step"
        time.sleep(0.3)
    # The Ray head has 2 CPUs and the run holds one. Project urgent (weight 3: three quarters
    # of the devices) submits a run of priority 50 that needs both: the first run's project
    # holds more than its quarter, so it is preempted.
    urgent_project = Project.objects.create(name="urgent", share_weight=3.0)
    Membership.objects.create(project=urgent_project, user=experiment.created_by, role=Role.OWNER)
    urgent_experiment = Experiment.objects.create(project=urgent_project, name="hotfix",
                                                  created_by=experiment.created_by)
    urgent_spec = {**tiny_run(1), "resources": {"device_type": "cpu", "devices_per_node": 2}}
    urgent_spec["actor"] = {**urgent_spec["actor"], "ppo_micro_batch_size": 8}
    urgent = submit(client, urgent_experiment, urgent_spec, priority=50)
    done = wait_state(urgent, {"SUCCEEDED", "FAILED"}, 400, worker)
    assert done.state == "SUCCEEDED", done.error
    run = wait_state(victim, {"SUCCEEDED", "FAILED"}, 400, worker)
    assert run.state == "SUCCEEDED", run.error

    states = [e.to_state for e in run.events.all()]
    assert states[:4] == ["QUEUED", "SCHEDULED", "STARTING", "RUNNING"], states
    assert states[4:6] == ["PREEMPTING", "QUEUED"] and states[-1] == "SUCCEEDED", states
    first, second = run.attempts.order_by("number")
    assert first.preempted and not second.preempted  # (Ray reports no exit code once stopped)
    assert first.exit_message.startswith("preempted: ")
    stopped_log = "".join(first.log_chunks.values_list("text", flat=True))
    assert "stopping: asked to stop (SIGTERM)" in stopped_log, stopped_log[-3000:]
    saved = re.search(r"stopped at step (\d+): checkpoint \S+ saved; a restart resumes from it",
                      stopped_log)
    assert saved and 2 <= int(saved.group(1)) < steps, stopped_log[-3000:]
    assert "resumed from" in "".join(second.log_chunks.values_list("text", flat=True))

    # Every step once, and each equal to an uninterrupted run of the same spec.
    output = Path(dispatch_env["ASCENT_RUNS_DIR"]) / f"run-{victim}"
    logged = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in logged] == list(range(1, steps + 1))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the job's rank (resources.cpus_per_device)
    try:
        reference = RLTrainer(resolve_spec({**spec, "trainer": {
            **spec["trainer"], "output_dir": str(tmp_path / "straight")}}))
        reference.fit()
    finally:
        torch.set_num_threads(threads)
    straight = [json.loads(line) for line in
                (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    for left, right in zip(straight, logged, strict=True):
        assert stable_metrics(right) == pytest.approx(stable_metrics(left), abs=1e-6), left["step"]
