"""The runs list (API and web UI) reads only what it shows, in a fixed number of queries."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import Membership, Project
from clusters.models import Cluster
from experiments.models import Experiment, Run, RunTag

SPEC_COLUMN = '"experiments_run"."spec"'


@pytest.fixture
def many_runs(users, project, experiment, cluster, tiny_spec):
    """60 runs in two projects, by several creators, some pinned to a cluster."""
    other = Project.objects.create(name="beta")
    Membership.objects.create(project=other, user=users["owner"], role="owner")
    second = Experiment.objects.create(project=other, name="sweep", created_by=users["owner"])
    other_cluster = Cluster.objects.create(name="gpu-b", device_type="gpu", ray_address="http://h:8265")
    creators = [users["owner"], users["maintainer"], users["admin"]]
    Run.objects.bulk_create(
        Run(experiment=(experiment, second)[i % 2], name=f"r{i}", spec={**tiny_spec, "seed": i},
            algorithm="grpo", device_type="cpu", device_count=1, created_by=creators[i % 3],
            cluster=(None, cluster, other_cluster)[i % 3])
        for i in range(60))
    RunTag.objects.bulk_create(RunTag(run=run, name=name) for run in Run.objects.all()[:10]
                               for name in ("baseline", "sweep"))
    return Run.objects.all()


def list_queries(client, page_size: int) -> tuple[list[str], dict]:
    client.get("/api/v1/runs/?page_size=1")  # the token's last_used_at is written on first use
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/api/v1/runs/?page_size={page_size}")
    assert response.status_code == 200, response.json()
    return [q["sql"] for q in queries.captured_queries], response.json()


@pytest.mark.parametrize("persona", ["owner", "admin"])
def test_it_lists_5_or_50_runs_in_the_same_three_queries(clients, many_runs, persona):
    few, few_body = list_queries(clients[persona], 5)
    many, many_body = list_queries(clients[persona], 50)
    assert (len(few_body["results"]), len(many_body["results"])) == (5, 50)
    # the token, one page of runs with their relations, the page's tags
    assert len(few) == len(many) <= 3, many
    assert sum(bool(run["tags"]) for run in many_body["results"]) == 10


def test_it_lists_runs_within_a_query_budget(clients, many_runs, django_assert_max_num_queries):
    with django_assert_max_num_queries(4):  # token, last_used_at write, the page, its tags
        response = clients["owner"].get("/api/v1/runs/?page_size=50")
    assert response.status_code == 200 and len(response.json()["results"]) == 50


def test_it_leaves_the_spec_out_of_the_list_but_not_out_of_a_run(clients, many_runs):
    results = clients["owner"].get("/api/v1/runs/?page_size=50").json()["results"]
    assert results and all("spec" not in run for run in results)
    assert {"project", "experiment", "created_by", "cluster"} <= set(results[0])
    detail = clients["owner"].get(f"/api/v1/runs/{results[0]['id']}/").json()
    assert detail["spec"]["seed"] == Run.objects.get(pk=results[0]["id"]).spec["seed"]


@pytest.mark.parametrize("persona", ["owner", "admin"])
def test_the_list_query_does_not_select_the_spec_column(clients, many_runs, persona):
    sql, _ = list_queries(clients[persona], 50)
    runs_sql = [q for q in sql if q.startswith("SELECT") and '"experiments_run"' in q]
    assert len(runs_sql) == 1, sql
    assert SPEC_COLUMN not in runs_sql[0]
    assert "DISTINCT" not in runs_sql[0]


def test_it_shows_each_visible_run_once_and_no_others(users, clients, many_runs, experiment):
    # a second membership row of another user must not duplicate the owner's runs
    Membership.objects.create(project=experiment.project, user=users["stranger"], role="viewer")
    seen = [r["id"] for r in clients["owner"].get("/api/v1/runs/?page_size=500").json()["results"]]
    assert sorted(seen) == sorted(many_runs.values_list("id", flat=True))
    viewer = [r["id"] for r in clients["viewer"].get("/api/v1/runs/?page_size=500").json()["results"]]
    assert sorted(viewer) == sorted(many_runs.filter(experiment=experiment).values_list("id", flat=True))
    assert len(clients["admin"].get("/api/v1/runs/?page_size=500").json()["results"]) == 60


def test_the_web_ui_runs_table_does_not_load_spec_bodies(client, users, many_runs):
    client.force_login(users["owner"])
    client.get("/runs/")
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/runs/")
    assert response.status_code == 200
    runs_sql = [q["sql"] for q in queries.captured_queries
                if q["sql"].startswith("SELECT") and 'FROM "experiments_run"' in q["sql"]]
    assert runs_sql and all(SPEC_COLUMN not in q for q in runs_sql), runs_sql


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata"])
def test_the_list_shows_each_run_as_the_generic_serializer_would(many_runs, users, zone):
    from django.utils import timezone
    from rest_framework import serializers
    from rest_framework.renderers import JSONRenderer

    from api.serializers import RunListSerializer
    from experiments.queries import with_tag_names

    first, second = many_runs.order_by("id")[:2]
    Run.objects.filter(pk=second.pk).update(
        cloned_from=first, resume_from=first, created_by=None, started_at=timezone.now(),
        finished_at=timezone.now(), state="FAILED", error="out of memory", progress_step=3,
        progress_at=timezone.now(), planned_steps=10, waiting_cause="quota", preemptible=False)
    RunTag.objects.bulk_create(RunTag(run=second, name=name) for name in ("b", "Zed", "alpha", "A"))
    generic = RunListSerializer()
    with timezone.override(zone):
        runs = list(Run.objects.select_related("experiment", "created_by", "cluster")
                    .prefetch_related("tags").order_by("id"))
        expected = [serializers.ModelSerializer.to_representation(generic, run) for run in runs]
        rows = list(Run.objects.order_by("id").values(*RunListSerializer.columns()))
        page = RunListSerializer(with_tag_names(rows), many=True).data
    assert JSONRenderer().render(page) == JSONRenderer().render(expected)
    assert [list(row) for row in page] == [list(generic.fields)] * len(runs)
    assert (page[1]["cloned_from"], page[1]["created_by"], page[1]["is_terminal"]) == (first.pk, None, True)
    assert page[1]["tags"] == ["A", "alpha", "b", "Zed"]


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata"])
def test_a_run_shows_as_the_generic_serializer_would(clients, many_runs, cluster, zone):
    from django.utils import timezone
    from rest_framework.renderers import JSONRenderer

    from api.serializers import RunSerializer
    from experiments.models import Attempt

    run = many_runs.order_by("id").first()
    Run.objects.filter(pk=run.pk).update(note="why", state="RUNNING", started_at=timezone.now())
    RunTag.objects.bulk_create(RunTag(run=run, name=name) for name in ("b", "A"))
    for number in (2, 1):
        Attempt.objects.create(run=run, number=number, cluster=cluster, device_count=2,
                               ray_submission_id=Attempt.submission_id(run.pk, number),
                               ended_at=timezone.now() if number == 1 else None,
                               exit_code=1 if number == 1 else None, exit_message="oom")
    from registry.models import ModelVersion, RegisteredModel

    model = RegisteredModel.objects.create(project=run.experiment.project, name="adder")
    for step, number in ((4, 1), (8, None)):  # one registered, one being exported
        ModelVersion.objects.create(model=model, run=run, step=step, version=number,
                                    state="ready" if number else "pending")
    with timezone.override(zone):
        body = clients["owner"].get(f"/api/v1/runs/{run.pk}/").content
        run = (Run.objects.select_related("experiment", "created_by", "cluster")
               .prefetch_related("tags", "attempts__cluster").get(pk=run.pk))
        expected = JSONRenderer().render(RunSerializer(run).data)
    assert body == expected
    assert [a["number"] for a in RunSerializer(run).data["attempts"]] == [1, 2]
    assert [(v["name"], v["version"], v["state"]) for v in
            RunSerializer(run).data["model_versions"]] == [("adder", 1, "ready"),
                                                           ("adder", None, "pending")]


def test_the_list_selects_only_the_columns_it_shows():
    from api.serializers import RunListSerializer

    columns = RunListSerializer.columns()
    assert {"spec", "note", "idempotency_key", "created_by", "cluster", "attempts",
            "tags"}.isdisjoint(columns)
    assert {"created_by__username", "cluster__name", "experiment__project_id"} <= set(columns)


def test_a_run_asked_for_with_a_filter_still_has_to_match_it(clients, many_runs):
    run = many_runs.first()
    assert clients["owner"].get(f"/api/v1/runs/{run.pk}/").status_code == 200
    assert clients["owner"].get(f"/api/v1/runs/{run.pk}/?state=RUNNING").status_code == 404
    assert clients["owner"].get(f"/api/v1/runs/{run.pk}/?state=QUEUED").status_code == 200
