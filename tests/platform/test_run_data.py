"""What a run produced, through the API: its log (paged and streamed), metrics without an
MLflow run, and a cluster's utilisation. (Metrics and artifacts from a real MLflow server are
covered end to end in tests/integration/test_dispatch.py.)"""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from experiments.models import Attempt, LogChunk, Run


@pytest.fixture
def run_with_log(submit, cluster):
    run = Run.objects.get(pk=submit().json()["id"])
    Run.objects.filter(pk=run.pk).update(state="RUNNING", cluster=cluster, device_type="npu",
                                         device_count=8)
    attempt = Attempt.objects.create(run=run, number=1, cluster=cluster, device_count=8,
                                     ray_submission_id=Attempt.submission_id(run.pk, 1))
    LogChunk.objects.create(attempt=attempt, offset=0, text="step 1: reward/mean=0.1\n")
    LogChunk.objects.create(attempt=attempt, offset=24, text="step 2: reward/mean=0.3\n")
    Attempt.objects.filter(pk=attempt.pk).update(log_offset=48)
    return run, attempt


def test_the_log_is_read_by_offset(clients, run_with_log):
    run, _ = run_with_log
    page = clients["viewer"].get(f"/api/v1/runs/{run.pk}/logs/").json()
    assert page == {"attempt": 1, "offset": 48, "complete": False,
                    "text": "step 1: reward/mean=0.1\nstep 2: reward/mean=0.3\n"}
    page = clients["viewer"].get(f"/api/v1/runs/{run.pk}/logs/?offset=30").json()
    assert page["text"] == ": reward/mean=0.3\n" and page["offset"] == 48
    assert clients["viewer"].get(f"/api/v1/runs/{run.pk}/logs/?offset=48").json()["text"] == ""


@pytest.mark.parametrize(("query", "field"), [("attempt=7", "attempt"), ("offset=-1", "offset"),
                                              ("offset=x", "offset")])
def test_bad_log_parameters_name_the_field(clients, run_with_log, query, field):
    run, _ = run_with_log
    response = clients["owner"].get(f"/api/v1/runs/{run.pk}/logs/?{query}")
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == field


def test_a_stranger_sees_no_log(clients, run_with_log):
    run, _ = run_with_log
    assert clients["stranger"].get(f"/api/v1/runs/{run.pk}/logs/").status_code == 404


def test_the_log_streams_as_server_sent_events_until_the_run_ends(clients, run_with_log):
    run, attempt = run_with_log
    Attempt.objects.filter(pk=attempt.pk).update(ended_at=timezone.now(), exit_code=0)
    Run.objects.filter(pk=run.pk).update(state="SUCCEEDED")
    response = clients["owner"].get(f"/api/v1/runs/{run.pk}/logs/?follow=1")
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    body = b"".join(response.streaming_content).decode()
    events = [block.split("\n") for block in body.strip().split("\n\n") if block.startswith("event:")]
    assert [e[0] for e in events] == ["event: log", "event: end"]
    log = json.loads(events[0][1][len("data: "):])
    assert log["offset"] == 48 and log["text"].endswith("reward/mean=0.3\n")
    assert json.loads(events[1][1][len("data: "):])["state"] == "SUCCEEDED"


def test_metrics_of_a_run_not_yet_tracked_are_empty(clients, run_with_log):
    run, _ = run_with_log
    body = clients["viewer"].get(f"/api/v1/runs/{run.pk}/metrics/").json()
    assert body == {"mlflow_run_id": "", "mlflow_url": "", "keys": [], "latest": {}, "history": {}}
    assert clients["viewer"].get(f"/api/v1/runs/{run.pk}/artifacts/").json() == []
    bad = clients["viewer"].get(f"/api/v1/runs/{run.pk}/metrics/?max_points=1")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "max_points"


def test_cluster_utilisation_counts_what_attempts_hold(clients, run_with_log, cluster):
    run, _ = run_with_log
    body = clients["viewer"].get(f"/api/v1/clusters/{cluster.pk}/utilisation/").json()
    assert body["kinds"]["npu"] == {"total": 8, "healthy": 8, "held": 8, "free": 0, "utilisation": 1.0}
    assert [r["id"] for r in body["runs"]] == [run.pk]
