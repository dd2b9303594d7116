"""Polling a run, the runs list or a run's metrics: an ETag on every answer, and 304 Not Modified
with no body while nothing in the answer changed, for each user as they see it."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from accounts.models import Membership, Project
from clusters.models import Cluster
from experiments.models import Attempt, Experiment, Run, RunTag

LIST = "/api/v1/runs/"


@pytest.fixture
def run(submit, cluster):
    run = Run.objects.get(pk=submit().json()["id"])
    Run.objects.filter(pk=run.pk).update(cluster=cluster)
    run.refresh_from_db()
    return run


def etag_of(client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    assert response["Cache-Control"] == "private, no-cache"
    return response["ETag"]


@pytest.mark.parametrize("url", [LIST, "{run}", "{run}metrics/",
                                 f"{LIST}?page_size=1&state=QUEUED"])
def test_it_answers_a_matching_if_none_match_with_304_and_no_body(clients, run, url):
    url = url.format(run=f"{LIST}{run.pk}/")
    etag = etag_of(clients["viewer"], url)
    again = clients["viewer"].get(url, HTTP_IF_NONE_MATCH=etag)
    assert again.status_code == 304 and again.content == b""
    assert again["ETag"] == etag
    assert clients["viewer"].get(url, HTTP_IF_NONE_MATCH=f"W/{etag}").status_code == 304
    assert clients["viewer"].get(url, HTTP_IF_NONE_MATCH='"other"').status_code == 200


def rename_cluster(run):
    Cluster.objects.filter(pk=run.cluster_id).update(name="npu-renamed")


def rename_creator(run):
    get_user_model().objects.filter(pk=run.created_by_id).update(username="owner-renamed")


def add_attempt(run):
    Attempt.objects.create(run=run, number=1, cluster=run.cluster, device_count=1,
                           ray_submission_id=Attempt.submission_id(run.pk, 1))


# Each changes what a run's answer holds; none of them moves the run's updated_at.
CHANGES = {
    "progress": lambda run: Run.objects.filter(pk=run.pk).update(progress_step=7),
    "state": lambda run: Run.objects.filter(pk=run.pk).update(state="RUNNING"),
    "waiting_reason": lambda run: Run.objects.filter(pk=run.pk).update(waiting_reason="quota"),
    "tag": lambda run: RunTag.objects.create(run=run, name="baseline"),
    "cluster name": rename_cluster,
    "creator's name": rename_creator,
}


@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("url", [LIST, "{run}"])
def test_any_change_to_what_a_run_shows_changes_its_etag(clients, run, change, url):
    url = url.format(run=f"{LIST}{run.pk}/")
    before = etag_of(clients["owner"], url)
    updated_at = Run.objects.get(pk=run.pk).updated_at
    CHANGES[change](run)
    assert Run.objects.get(pk=run.pk).updated_at == updated_at
    response = clients["owner"].get(url, HTTP_IF_NONE_MATCH=before)
    assert response.status_code == 200 and response["ETag"] != before


def test_a_new_attempt_changes_the_etag_of_the_run_but_not_of_the_list(clients, run):
    detail, listed = etag_of(clients["owner"], f"{LIST}{run.pk}/"), etag_of(clients["owner"], LIST)
    add_attempt(run)
    assert clients["owner"].get(f"{LIST}{run.pk}/", HTTP_IF_NONE_MATCH=detail).status_code == 200
    assert clients["owner"].get(LIST, HTTP_IF_NONE_MATCH=listed).status_code == 304  # not listed


def test_a_new_run_changes_the_etag_of_the_list(clients, run, submit):
    before = etag_of(clients["owner"], LIST)
    submit()
    assert clients["owner"].get(LIST, HTTP_IF_NONE_MATCH=before).status_code == 200


def test_a_user_who_sees_other_runs_does_not_match_anothers_etag(clients, users, run):
    other = Project.objects.create(name="beta")
    Membership.objects.create(project=other, user=users["owner"], role="owner")
    experiment = Experiment.objects.create(project=other, name="sweep", created_by=users["owner"])
    Run.objects.create(experiment=experiment, spec={}, algorithm="grpo", device_type="cpu",
                       device_count=1, created_by=users["owner"])
    owners = etag_of(clients["owner"], LIST)
    assert clients["viewer"].get(LIST, HTTP_IF_NONE_MATCH=owners).status_code == 200
    assert etag_of(clients["viewer"], LIST) != owners
    # and a run one cannot see is a 404 whatever the ETag
    detail = etag_of(clients["owner"], f"{LIST}{run.pk}/")
    assert clients["stranger"].get(f"{LIST}{run.pk}/", HTTP_IF_NONE_MATCH=detail).status_code == 404


def test_answers_that_are_not_polled_pages_carry_no_etag(clients, run):
    assert "ETag" not in clients["owner"].get(f"{LIST}{run.pk}/events/")
    response = clients["owner"].get(f"{LIST}?state=NOPE")
    assert response.status_code == 400 and "ETag" not in response


def test_a_log_stream_carries_no_etag(transactional_db, clients, run):
    stream = clients["owner"].get(f"{LIST}{run.pk}/logs/?follow=1")
    stream.close()  # ends its request (and its database connection), freeing its stream slot
    assert stream.status_code == 200 and "ETag" not in stream
