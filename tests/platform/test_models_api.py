"""The model registry's rules on real PostgreSQL through the API: who sees and changes models,
what a registration and a change refuse (before MLflow is asked), aliases that move between
versions, and the `models:/` paths a submission may name. The export and registration in MLflow
run end to end in tests/integration/test_model_registry.py."""

from __future__ import annotations

import pytest

from experiments.models import Run
from registry.models import ModelAlias, ModelVersion, RegisteredModel, VersionState

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(experiment, users):
    return Run.objects.create(experiment=experiment, spec={"algorithm": "grpo"}, algorithm="grpo",
                              state="SUCCEEDED", created_by=users["owner"], device_type="cpu",
                              device_count=1)


@pytest.fixture
def adder(project, run, users):
    model = RegisteredModel.objects.create(project=project, name="adder", created_by=users["owner"])
    versions = [ModelVersion.objects.create(model=model, run=run, step=step, version=number,
                                            state=VersionState.READY, lineage={"data": {}})
                for number, step in ((1, 2), (2, 4))]
    ModelAlias.objects.create(model=model, name="champion", version=versions[0])
    return model, versions


def test_members_see_their_projects_models_and_strangers_see_none(clients, adder):
    model, (v1, v2) = adder
    listed = clients["viewer"].get("/api/v1/models/").json()["results"]
    assert [(m["name"], m["latest_version"], m["aliases"]) for m in listed] == [
        ("adder", 2, {"champion": 1})]
    assert clients["stranger"].get("/api/v1/models/").json()["results"] == []
    assert clients["stranger"].get(f"/api/v1/models/{model.pk}/").status_code == 404
    assert clients["stranger"].get(f"/api/v1/model-versions/{v1.pk}/").status_code == 404
    assert clients["admin"].get(f"/api/v1/model-versions/{v1.pk}/").json()["uri"] == \
        "models:/adder/1"
    by_run = clients["owner"].get(f"/api/v1/model-versions/?run={v1.run_id}").json()["results"]
    assert sorted(v["version"] for v in by_run) == [1, 2]


@pytest.mark.parametrize(("body", "field", "text"), [
    ({"name": "a b"}, "name", "A model name is 1-128"),
    ({"name": "x", "aliases": ["latest"]}, "aliases", "not an alias"),
    ({"name": "x", "aliases": ["v3"]}, "aliases", "not an alias"),
    ({"name": "x", "colour": 1}, "colour", "Unknown key"),
    ({"name": "x", "step": -1}, "step", "greater than or equal to 0"),
])
def test_a_bad_registration_is_refused_naming_the_field(clients, run, body, field, text):
    answer = clients["owner"].post("/api/v1/model-versions/", {"run": run.pk, **body},
                                   format="json")
    assert answer.status_code == 400, answer.content
    errors = answer.json()["errors"]
    assert any(e["field"] == field and text in e["message"] for e in errors), errors
    assert not ModelVersion.objects.filter(model__name="x").exists()


def test_viewers_and_strangers_cannot_register(clients, run):
    body = {"run": run.pk, "name": "adder"}
    assert clients["viewer"].post("/api/v1/model-versions/", body, format="json").status_code == 403
    assert clients["stranger"].post("/api/v1/model-versions/", body,
                                    format="json").status_code == 404


def test_a_name_of_another_projects_model_is_refused(clients, run, adder):
    from accounts.models import Project

    RegisteredModel.objects.create(project=Project.objects.create(name="beta"), name="theirs")
    answer = clients["owner"].post("/api/v1/model-versions/", {"run": run.pk, "name": "theirs"},
                                   format="json")
    assert answer.status_code == 400, answer.content
    assert "belongs to a model of another project" in answer.json()["errors"][0]["message"]


def test_an_alias_moves_to_the_version_it_is_set_on_and_a_pending_one_keeps_it_asked(
        clients, adder, run, settings, unused_address):
    model, (v1, v2) = adder
    settings.MLFLOW_TRACKING_URI = unused_address  # nothing answers: a change must not need it
    pending = ModelVersion.objects.create(model=model, run=run, step=6)
    answer = clients["maintainer"].patch(f"/api/v1/model-versions/{pending.pk}/",
                                         {"aliases": ["champion", "next"], "description": "soon"},
                                         format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["aliases"] == ["champion", "next"] and answer.json()["state"] == "pending"
    assert ModelAlias.objects.get(model=model, name="champion").version == v1  # not yet moved
    from audit.models import AuditEntry

    entry = AuditEntry.objects.get(action="model_version.update")
    assert (entry.actor_name, entry.object_id, entry.project_id) == (
        "maintainer", str(pending.pk), model.project_id)
    assert entry.details["aliases"] == "['champion', 'next']", entry.details
    assert clients["viewer"].patch(f"/api/v1/model-versions/{v2.pk}/", {"aliases": []},
                                   format="json").status_code == 403


def test_a_spec_may_name_only_ready_versions_and_aliases_of_readable_models(
        submit, clients, adder, project):
    model, (v1, v2) = adder
    ModelVersion.objects.create(model=model, run=v1.run, step=8, version=3,
                                state=VersionState.FAILED)

    def refusal(path):
        answer = submit(spec={"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}},
                              "model": {"path": path}})
        return answer.status_code, answer.json().get("errors")

    assert submit(spec={"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}},
                        "model": {"path": "models:/adder@champion"}}).status_code == 201
    assert submit(spec={"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}},
                        "model": {"path": "models:/adder/2"}}).status_code == 201
    status, errors = refusal("models:/adder/3")
    assert status == 400 and "no ready version 3; its ready versions: 1 (champion), 2" in \
        errors[0]["message"] and errors[0]["field"].endswith("model.path"), errors
    status, errors = refusal("models:/adder@next")
    assert status == 400 and "no ready alias 'next'" in errors[0]["message"]
    status, errors = refusal("models:/nobody/1")
    assert status == 400 and "no registered model named 'nobody'" in errors[0]["message"]
    status, errors = refusal("models:/adder")
    assert status == 400 and "models:/<name>/<version>" in errors[0]["message"]
    # The dry run says the same, and a stranger may not name the model at all.
    body = {"spec": {"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}},
                     "model": {"path": "models:/adder/3"}}}
    answer = clients["owner"].post("/api/v1/runs/validate/", body, format="json")
    assert answer.status_code == 400 and "no ready version 3" in answer.content.decode()
    body["spec"]["model"]["path"] = "models:/adder/1"
    assert clients["owner"].post("/api/v1/runs/validate/", body, format="json").status_code == 200
    answer = clients["stranger"].post("/api/v1/runs/validate/", body, format="json")
    assert answer.status_code == 400 and "no registered model named 'adder'" in \
        answer.content.decode()


def test_a_change_mlflow_cannot_take_is_a_503_and_changes_nothing(clients, adder, settings,
                                                                  unused_address):
    model, (v1, v2) = adder
    settings.MLFLOW_TRACKING_URI = unused_address
    answer = clients["owner"].patch(f"/api/v1/model-versions/{v2.pk}/",
                                    {"aliases": ["champion"], "description": "new"},
                                    format="json")
    assert answer.status_code == 503, answer.content
    assert ModelAlias.objects.get(model=model, name="champion").version == v1
    assert ModelVersion.objects.get(pk=v2.pk).description == ""
