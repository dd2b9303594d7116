"""The `ascent` command end to end, as a pipeline runs it: against this live server, a Celery
worker process, a Ray head and an MLflow server. A job submits a spec with overrides and follows
the run to its end, the exit status its outcome; the job retried finds the same run; its metrics
come out as CSV and JSON; its checkpoint is registered as a model version; a failed run, a
cancelled run, a refused spec and an unreachable server each exit with their own status."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accounts.choices import Role
from accounts.models import ApiToken, Membership, Project
from clusters.models import Cluster
from experiments.models import Experiment, Run
from tests.stack import tiny_run, wait_state

pytestmark = pytest.mark.django_db(transaction=True)
ASCENT = Path(sys.executable).parent / "ascent"


@pytest.fixture
def pipeline(django_user_model, ray_head, live_server, tmp_path):
    """ascent(*args): the command as a GitHub Actions job of team/rl runs it, with an API token
    of the owner of project "pipes" (experiment "nightly"); the spec file a two-step run."""
    user = django_user_model.objects.create_user("owner")
    project = Project.objects.create(name="pipes")
    Membership.objects.create(project=project, user=user, role=Role.OWNER)
    Experiment.objects.create(project=project, name="nightly", created_by=user)
    Cluster.objects.create(name="local", device_type="cpu", ray_address=ray_head)
    token = ApiToken.issue(user, "ci")[1]
    env = {**os.environ, "ASCENT_URL": live_server.url, "ASCENT_TOKEN": token,
           "GITHUB_RUN_ID": "77", "GITHUB_REPOSITORY": "team/rl", "GITHUB_JOB": "train"}
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_run(4)))

    def ascent(*args: str, timeout: float = 400, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(ASCENT), *args], env={**env, **extra}, capture_output=True,
                              text=True, timeout=timeout)

    return ascent, spec


def test_a_pipeline_submits_follows_and_reads_the_metrics(pipeline, worker, mlflow_server):
    ascent, spec = pipeline
    submit = ("runs", "submit", str(spec), "--experiment", "pipes/nightly",
              "--set", "trainer.total_steps=2", "--poll", "1")
    followed = ascent(*submit, "--follow")
    assert followed.returncode == 0, followed.stderr
    run = Run.objects.get()
    assert run.state == "SUCCEEDED" and run.spec["trainer"]["total_steps"] == 2
    assert f"run {run.pk}, attempt 1" in followed.stdout and "step 2:" in followed.stdout
    assert f"run {run.pk} submitted (QUEUED)" in followed.stderr
    assert f"run {run.pk}: SUCCEEDED" in followed.stderr

    retried = ascent(*submit, "--wait", GITHUB_RUN_ATTEMPT="2")  # the job, re-run
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == str(run.pk) and "already submitted" in retried.stderr
    assert Run.objects.count() == 1

    table = ascent("runs", "metrics", str(run.pk), "--keys", "reward/mean,actor/pg_loss")
    assert table.returncode == 0, table.stderr
    rows = list(csv.reader(table.stdout.splitlines()))
    assert rows[0] == ["key", "step", "value", "timestamp_ms"]
    assert [(r[0], r[1]) for r in rows[1:]] == [("reward/mean", "1"), ("reward/mean", "2"),
                                              ("actor/pg_loss", "1"), ("actor/pg_loss", "2")]
    whole = json.loads(ascent("runs", "metrics", str(run.pk), "--format", "json").stdout)
    assert {"reward/mean", "actor/pg_loss", "perf/tokens_per_s"} <= set(whole["history"])

    # The pipeline registers what the run made, and reads back the path a next run starts from.
    registered = ascent("models", "register", str(run.pk), "--name", "nightly", "--alias",
                        "latest-good", "--wait", "--poll", "1")
    assert registered.returncode == 0, registered.stderr
    assert registered.stdout.strip() == "models:/nightly/1", registered.stderr
    refused = ascent("models", "register", str(run.pk), "--name", "nightly", "--step", "3")
    assert refused.returncode == 2 and "no checkpoint at step 3" in refused.stderr


def test_each_ending_has_its_own_exit_status(pipeline, worker):
    ascent, spec = pipeline
    failed = ascent("runs", "submit", str(spec), "--experiment", "pipes/nightly",
                    "--set", "model.path=/nowhere/model", "--wait", "--poll", "1")
    assert failed.returncode == 1, failed.stderr
    assert "failed:" in failed.stderr and "/nowhere/model" in failed.stderr

    long = ascent("runs", "submit", str(spec), "--experiment", "pipes/nightly",
                  "--set", "trainer.total_steps=400")
    assert long.returncode == 0, long.stderr
    run_id = int(long.stdout)
    wait_state(run_id, {"RUNNING"}, 300, worker)
    cancelled = ascent("runs", "cancel", str(run_id), "--wait", "--poll", "1")
    assert cancelled.returncode == 3, cancelled.stderr
    assert ascent("runs", "wait", str(run_id)).returncode == 3

    refused = ascent("runs", "submit", str(spec), "--experiment", "pipes/nightly",
                     "--set", "actor.lr=-1")
    assert refused.returncode == 2 and "actor.lr" in refused.stderr, refused.stderr
    unknown = ascent("runs", "submit", str(spec), "--experiment", "pipes/weekly")
    assert unknown.returncode == 2 and "no experiment named 'weekly'" in unknown.stderr
    away = ascent("runs", "show", str(run_id), ASCENT_URL="http://127.0.0.1:9")
    assert away.returncode == 4 and "cannot be reached" in away.stderr
    assert Run.objects.count() == 2  # nothing refused was stored
