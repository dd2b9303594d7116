"""Submitting, validating, listing, cancelling and cloning runs through the API."""

from __future__ import annotations

import json

import pytest

from experiments.choices import RunState
from experiments.models import Run, RunEvent
from experiments.services import transition


def errors_of(response) -> dict[str, str]:
    return {e["field"]: e["message"] for e in response.json()["errors"]}


def test_it_stores_a_submitted_run_queued_with_its_resolved_spec(submit, users):
    response = submit(name="first", priority=5, max_restarts=2)
    assert response.status_code == 201, response.json()
    body = response.json()
    run = Run.objects.get(pk=body["id"])
    assert (run.state, run.name, run.priority, run.max_restarts) == ("QUEUED", "first", 5, 2)
    assert run.created_by == users["owner"]
    # unset fields took the GRPO preset, and the spec is stored resolved
    assert run.spec["algorithm"] == "grpo" and run.spec["advantage"]["adv_estimator"] == "grpo"
    assert (run.device_type, run.device_count) == ("cpu", 1)
    assert body["spec"] == run.spec
    event = RunEvent.objects.get(run=run)
    assert (event.from_state, event.to_state, event.actor) == ("", "QUEUED", "owner")


def test_overrides_apply_before_validation(submit):
    response = submit(overrides=["rollout.n_samples_per_prompt=8", "resources.devices_per_node=2",
                                 "data.train_batch_size=8"])
    assert response.status_code == 201, response.json()
    run = Run.objects.get(pk=response.json()["id"])
    assert run.spec["rollout"]["n_samples_per_prompt"] == 8 and run.device_count == 2


@pytest.mark.parametrize(
    ("spec_patch", "overrides", "field", "words"),
    [
        ({"rollout": {"n_sample_per_prompt": 4}}, [], "spec.rollout.n_sample_per_prompt",
         "did you mean 'n_samples_per_prompt'"),
        ({"surprise": 1}, [], "spec.surprise", "not permitted"),
        ({"actor": {"clip_ratio_low": 0.3, "clip_ratio_high": 0.2}}, [], "spec.actor.clip_ratio_low",
         "clip_ratio_high"),
        ({"algorithm": "dapo", "reference": {"enable": True}}, [], "spec.reference.enable",
         "reference.enable=false"),
        ({"algorithm": "reinforce"}, [], "spec.algorithm", "grpo"),
        ({}, ["rollout.temperature=0"], "spec.rollout.temperature", "greater than 0"),
        ({}, ["no-equals-sign"], "spec", "="),
        ({"reward": {"functions": [{"name": "math_acc"}]}}, [], "spec.reward.functions.0.name",
         "choose one of"),
        ({"reward": {"functions": [{"name": "exact_match", "kwargs": {"loose": True}}]}}, [],
         "spec.reward.functions.0.kwargs", "loose"),
    ],
)
def test_an_invalid_spec_is_a_400_naming_the_field_path(submit, tiny_spec, spec_patch, overrides,
                                                         field, words):
    before = Run.objects.count()
    response = submit(spec={**tiny_spec, **spec_patch}, overrides=overrides)
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid"
    fields = errors_of(response)
    matching = [f for f in fields if f == field or (field == "spec" and f.startswith("spec"))]
    assert matching, fields
    assert words in fields[matching[0]], fields
    assert Run.objects.count() == before  # nothing half-written


def test_every_failing_field_is_reported_at_once(submit, tiny_spec):
    spec = {**tiny_spec, "rollout": {"temperature": -1, "top_p": 7}, "bogus": True}
    fields = errors_of(submit(spec=spec))
    assert {"spec.rollout.temperature", "spec.rollout.top_p", "spec.bogus"} <= set(fields)


def test_submission_fields_are_validated_too(submit, tiny_spec):
    response = submit(spec=[1, 2], priority=500, experiment=999999)
    assert response.status_code == 400
    assert {"spec", "priority", "experiment"} <= set(errors_of(response))


def test_an_oversized_body_is_rejected_before_parsing(clients, experiment, settings, tiny_spec):
    padding = "x" * (settings.ASCENT_MAX_BODY_BYTES + 1)
    body = json.dumps({"experiment": experiment.pk, "spec": {**tiny_spec, "name": padding}})
    response = clients["owner"].post("/api/v1/runs/", body, content_type="application/json")
    assert response.status_code == 413
    assert "ASCENT_MAX_BODY_BYTES" in response.json()["detail"]
    assert not Run.objects.exists()


def test_malformed_json_is_a_400(clients):
    response = clients["owner"].post("/api/v1/runs/", "{not json", content_type="application/json")
    assert response.status_code == 400 and response.json()["error"] == "invalid"


def test_the_same_idempotency_key_returns_the_first_run(clients, experiment, tiny_spec):
    body = {"experiment": experiment.pk, "spec": tiny_spec}
    post = lambda key: clients["owner"].post("/api/v1/runs/", body, format="json",  # noqa: E731
                                             HTTP_IDEMPOTENCY_KEY=key)
    first, repeat, other = post("pipeline-42"), post("pipeline-42"), post("pipeline-43")
    assert (first.status_code, repeat.status_code, other.status_code) == (201, 200, 201)
    assert first.json()["id"] == repeat.json()["id"] != other.json()["id"]
    assert Run.objects.count() == 2
    body["priority"] = 9  # the same key for a different request is refused, not ignored
    changed = post("pipeline-42")
    assert changed.status_code == 409 and "different request" in changed.json()["detail"]
    assert Run.objects.count() == 2


def test_validate_is_a_dry_run_with_the_resolved_spec_and_device_request(clients, cluster, tiny_spec):
    response = clients["viewer"].post(
        "/api/v1/runs/validate/",
        {"spec": {**tiny_spec, "resources": {"device_type": "npu", "devices_per_node": 8},
                  "data": {"synthetic": {"task": "addition"}, "train_batch_size": 16}},
         "overrides": ["rollout.n_samples_per_prompt=8"]},
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["valid"] is True
    assert body["device_request"] == {"device_type": "npu", "device_count": 8, "num_nodes": 1,
                                      "devices_per_node": 8}
    assert body["spec"]["rollout"]["n_samples_per_prompt"] == 8
    assert body["clusters"] == [{"name": "npu-a", "free": 8, "fits_now": True}]
    assert not Run.objects.exists()


def test_validate_reports_errors_like_submit(clients, tiny_spec):
    response = clients["viewer"].post("/api/v1/runs/validate/",
                                      {"spec": {**tiny_spec, "actor": {"lr": -1}}}, format="json")
    assert response.status_code == 400 and "spec.actor.lr" in errors_of(response)


def test_a_cluster_of_another_device_kind_is_refused(submit, cluster):
    response = submit(cluster="npu-a")  # the tiny spec asks for a CPU: fine anywhere
    assert response.status_code == 201
    response = submit(cluster="npu-a", overrides=["resources.device_type=gpu"])
    assert response.status_code == 400
    assert "resources.device_type=npu" in errors_of(response)["cluster"]
    assert submit(cluster="nowhere").status_code == 400


def test_cancel_of_a_queued_run_is_immediate(submit, clients):
    run_id = submit().json()["id"]
    response = clients["maintainer"].post(f"/api/v1/runs/{run_id}/cancel/")
    assert response.status_code == 200 and response.json()["state"] == "CANCELLED"
    events = clients["viewer"].get(f"/api/v1/runs/{run_id}/events/").json()
    assert [(e["from_state"], e["to_state"], e["actor"]) for e in events] == [
        ("", "QUEUED", "owner"), ("QUEUED", "CANCELLED", "maintainer")]


def test_cancel_of_a_running_run_asks_the_worker_and_is_repeatable(submit, clients):
    run_id = submit().json()["id"]
    for state in (RunState.SCHEDULED, RunState.STARTING, RunState.RUNNING):
        transition(run_id, state, actor="system:test")
    first = clients["owner"].post(f"/api/v1/runs/{run_id}/cancel/")
    again = clients["owner"].post(f"/api/v1/runs/{run_id}/cancel/")
    assert first.json()["state"] == again.json()["state"] == "CANCELLING"
    assert RunEvent.objects.filter(run_id=run_id, to_state="CANCELLING").count() == 1


def test_cancelling_a_finished_run_is_a_409(submit, clients):
    run_id = submit().json()["id"]
    for state in (RunState.SCHEDULED, RunState.STARTING, RunState.RUNNING, RunState.SUCCEEDED):
        transition(run_id, state, actor="system:test")
    response = clients["owner"].post(f"/api/v1/runs/{run_id}/cancel/")
    assert response.status_code == 409
    assert response.json() == {"error": "conflict", "detail": f"Run {run_id} is SUCCEEDED; it cannot "
                               "move to CANCELLING. It has already finished."}
    assert Run.objects.get(pk=run_id).state == "SUCCEEDED"


def test_clone_copies_the_spec_with_overrides(submit, clients):
    original = submit(name="base", priority=3).json()
    response = clients["maintainer"].post(f"/api/v1/runs/{original['id']}/clone/",
                                          {"overrides": ["actor.lr=0.0005"]}, format="json")
    assert response.status_code == 201, response.json()
    clone = response.json()
    assert (clone["state"], clone["name"], clone["priority"], clone["cloned_from"]) == (
        "QUEUED", "base (clone)", 3, original["id"])
    assert clone["spec"]["actor"]["lr"] == 0.0005
    assert {k: v for k, v in clone["spec"].items() if k != "actor"} == {
        k: v for k, v in original["spec"].items() if k != "actor"}
    assert clone["created_by"] == "maintainer"


def test_restart_continues_a_failed_run_in_its_output_folder(submit, clients, settings, tmp_path):
    from workers.dispatch import job_spec, run_output_dir

    settings.ASCENT_RUNS_DIR = tmp_path
    run_id = submit(name="base", priority=2).json()["id"]
    early = clients["owner"].post(f"/api/v1/runs/{run_id}/restart/")
    assert early.status_code == 409 and "Only failed or cancelled runs" in early.json()["detail"]
    transition(run_id, RunState.FAILED, actor="system:test", error="node lost")
    assert clients["viewer"].post(f"/api/v1/runs/{run_id}/restart/").status_code == 403
    response = clients["maintainer"].post(f"/api/v1/runs/{run_id}/restart/")
    assert response.status_code == 201, response.json()
    restart = response.json()
    assert (restart["state"], restart["name"], restart["priority"]) == ("QUEUED", "base (restart)", 2)
    assert restart["resume_from"] == restart["cloned_from"] == run_id
    original = Run.objects.get(pk=run_id)
    trainer = job_spec(Run.objects.get(pk=restart["id"]))["trainer"]
    assert trainer["output_dir"] == str(run_output_dir(original)) and trainer["resume_mode"] == "auto"
    # one unfinished run per chain; once it ends, a restart of the restart continues the same folder
    busy = clients["owner"].post(f"/api/v1/runs/{run_id}/restart/")
    assert busy.status_code == 409 and "already continues" in busy.json()["detail"]
    clients["owner"].post(f"/api/v1/runs/{restart['id']}/cancel/")
    again = clients["owner"].post(f"/api/v1/runs/{restart['id']}/restart/").json()
    assert again["resume_from"] == run_id and again["name"] == "base (restart)"


def test_a_bad_clone_override_is_a_400(submit, clients):
    run_id = submit().json()["id"]
    response = clients["owner"].post(f"/api/v1/runs/{run_id}/clone/",
                                     {"overrides": ["actor.lr=-3"]}, format="json")
    assert response.status_code == 400 and "spec.actor.lr" in errors_of(response)


def test_list_filters_by_state_experiment_creator_and_algorithm(submit, clients, experiment, tiny_spec):
    a = submit().json()["id"]
    b = submit(as_="maintainer", spec={**tiny_spec, "algorithm": "dapo"}).json()["id"]
    clients["owner"].post(f"/api/v1/runs/{a}/cancel/")
    owner = clients["owner"]

    def ids(query: str) -> set[int]:
        response = owner.get(f"/api/v1/runs/?{query}")
        assert response.status_code == 200, response.json()
        return {r["id"] for r in response.json()["results"]}

    assert ids("state=CANCELLED") == {a}
    assert ids("state=QUEUED&state=CANCELLED") == {a, b}
    assert ids("creator=maintainer") == {b}
    assert ids("algorithm=dapo") == {b}
    assert ids(f"experiment={experiment.pk}") == {a, b}
    assert owner.get("/api/v1/runs/?state=NOPE").status_code == 400
    assert ids("experiment=999999") == set()  # like another project's experiment: nothing shown


def test_runs_are_paginated_by_cursor_newest_first(submit, clients):
    made = [submit().json()["id"] for _ in range(5)]
    seen, url = [], "/api/v1/runs/?page_size=2"
    while url:
        page = clients["owner"].get(url).json()
        assert "spec" not in page["results"][0]  # lists stay small
        seen += [r["id"] for r in page["results"]]
        url = page["next"]
    assert seen == list(reversed(made))


def test_an_overlong_idempotency_key_is_a_400(clients, experiment, tiny_spec):
    response = clients["owner"].post("/api/v1/runs/", {"experiment": experiment.pk, "spec": tiny_spec},
                                     format="json", HTTP_IDEMPOTENCY_KEY="k" * 129)
    assert response.status_code == 400 and errors_of(response) == {"Idempotency-Key": "Use at most 128 characters."}
    assert not Run.objects.exists()
