"""A run's tags and note: edited through the API (PATCH) and the run page alike, refused with the
field named, found again by the runs filters and search, recorded in the audit log, and sent on
to MLflow by the worker."""

from __future__ import annotations

import pytest

from audit.models import AuditEntry
from experiments.models import Run, RunTag


@pytest.fixture
def run(experiment, users, tiny_spec):
    return Run.objects.create(experiment=experiment, name="lr sweep", spec=tiny_spec,
                              algorithm="grpo", device_type="cpu", device_count=1,
                              created_by=users["owner"], state="SUCCEEDED")


def patch(client, run, body):
    return client.patch(f"/api/v1/runs/{run.pk}/", body, format="json")


@pytest.mark.parametrize("persona", ["owner", "maintainer", "admin"])
def test_it_sets_tags_and_a_note_that_the_run_then_shows(clients, run, persona):
    response = patch(clients[persona], run, {"tags": [" paper ", "Baseline", "baseline", "lr  sweep"],
                                            "note": "  Best so far.\nKeep it.  "})

    assert response.status_code == 200, response.json()
    assert response.json()["tags"] == ["Baseline", "lr sweep", "paper"]  # once each, sorted
    assert response.json()["note"] == "Best so far.\nKeep it."
    run.refresh_from_db()
    assert run.tag_names == ["Baseline", "lr sweep", "paper"] and run.note == "Best so far.\nKeep it."
    assert clients[persona].get(f"/api/v1/runs/{run.pk}/").json()["tags"] == run.tag_names


def test_a_key_left_out_keeps_what_the_run_has_and_empty_values_clear(clients, run):
    patch(clients["owner"], run, {"tags": ["a", "b"], "note": "first"})

    assert patch(clients["owner"], run, {"note": "second"}).json()["tags"] == ["a", "b"]
    assert patch(clients["owner"], run, {"tags": ["b", "c"]}).json()["note"] == "second"
    assert list(RunTag.objects.filter(run=run).values_list("name", flat=True)) == ["b", "c"]
    cleared = patch(clients["owner"], run, {"tags": [], "note": ""}).json()
    assert (cleared["tags"], cleared["note"]) == ([], "")


@pytest.mark.parametrize(("persona", "status"), [("viewer", 403), ("stranger", 404),
                                                 ("anonymous", 401)])
def test_only_owners_and_maintainers_change_them(clients, run, persona, status):
    response = patch(clients[persona], run, {"tags": ["mine"]})

    assert response.status_code == status
    assert not RunTag.objects.filter(run=run).exists()


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"tags": ["a,b"]}, "tags.0", "holds a comma"),
    ({"tags": ["x" * 41]}, "tags.0", "40 characters"),
    ({"tags": ["ok", ""]}, "tags.1", "may not be blank"),
    ({"tags": [f"t{i}" for i in range(21)]}, "tags", "20"),
    ({"tags": ["bad\x07bell"]}, "tags.0", "control character"),
    ({"tags": "solo"}, "tags", "list"),
    ({"note": "n" * 10_001}, "note", "10000 characters"),
    ({"tag": ["typo"]}, "tag", "did you mean 'tags'"),
    ({"name": "renamed"}, "name", "Unknown key"),
])
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(clients, run, body, field, words):
    patch(clients["owner"], run, {"tags": ["kept"], "note": "kept"})

    response = patch(clients["owner"], run, body)

    assert response.status_code == 400
    errors = response.json()["errors"]
    assert any(e["field"] == field and words in e["message"] for e in errors), errors
    run.refresh_from_db()
    assert (run.tag_names, run.note, run.name) == (["kept"], "kept", "lr sweep")


def test_runs_are_found_by_tag_and_by_search(clients, run, experiment, users, tiny_spec):
    other = Run.objects.create(experiment=experiment, name="other", spec=tiny_spec, algorithm="grpo",
                               device_type="cpu", device_count=1, created_by=users["owner"])
    patch(clients["owner"], run, {"tags": ["Paper", "sweep"]})
    patch(clients["owner"], other, {"tags": ["sweep"]})

    def ids(query):
        body = clients["owner"].get(f"/api/v1/runs/?{query}").json()
        return sorted(r["id"] for r in body["results"])

    assert ids("tag=paper") == [run.pk]  # any case
    assert ids("tag=sweep") == sorted([run.pk, other.pk])
    assert ids("tag=sweep&tag=paper") == [run.pk]  # each of them
    assert ids("tag=nothing") == []
    assert ids("search=paper") == [run.pk]
    listed = clients["owner"].get("/api/v1/runs/").json()["results"]
    assert {r["id"]: r["tags"] for r in listed} == {run.pk: ["Paper", "sweep"], other.pk: ["sweep"]}
    assert all("note" not in r for r in listed)  # a page of runs leaves the notes out


def test_the_page_form_saves_them_and_redirects(signed_in, run):
    client = signed_in("maintainer")

    response = client.post(f"/runs/{run.pk}/notes/", {"tags": "paper, ,  best run ", "note": "why"})

    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/#notes"
    run.refresh_from_db()
    assert (run.tag_names, run.note) == (["best run", "paper"], "why")
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'href="/runs/?tag=best%20run"' in page and "<p>why</p>" in page
    assert 'value="best run, paper"' in page  # the form holds what the run has


def test_a_bad_tag_shows_the_page_again_with_what_was_typed(signed_in, run):
    client = signed_in("owner")

    response = client.post(f"/runs/{run.pk}/notes/", {"tags": "fine, " + "y" * 50, "note": "draft"})

    assert response.status_code == 400
    page = response.content.decode()
    assert f"“{'y' * 50}”: Ensure this field has no more than 40 characters." in page
    assert 'aria-invalid="true"' in page and "draft</textarea>" in page
    assert 'value="fine, ' + "y" * 50 + '"' in page
    run.refresh_from_db()
    assert (run.tag_names, run.note) == ([], "")


def test_a_viewer_sees_them_but_gets_no_form(signed_in, clients, run):
    patch(clients["owner"], run, {"tags": ["shown"], "note": "a note"})
    client = signed_in("viewer")

    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert "shown" in page and "a note" in page and "notes-form" not in page
    response = client.post(f"/runs/{run.pk}/notes/", {"tags": "mine"}, follow=True)
    assert "Viewers cannot change runs" in response.content.decode()
    assert run.tag_names == ["shown"]


def test_edits_are_in_the_audit_log(clients, signed_in, run):
    patch(clients["owner"], run, {"tags": ["api"], "note": "x"})
    signed_in("maintainer").post(f"/runs/{run.pk}/notes/", {"tags": "ui", "note": ""})

    entries = AuditEntry.objects.filter(action="run.update", object_id=str(run.pk)).order_by("id")
    assert [(e.actor_name, e.details.get("tags")) for e in entries] == [
        ("owner", "['api']"), ("maintainer", "ui")]
    assert entries[0].details["fields"] == ["note", "tags"]


def test_a_change_queues_the_mlflow_copy_once_the_run_has_an_mlflow_run(
        clients, run, django_capture_on_commit_callbacks, monkeypatch):
    from experiments import services

    sent = []
    monkeypatch.setattr(services, "notify_worker", lambda task, *args: sent.append((task, *args)))
    with django_capture_on_commit_callbacks(execute=True):
        patch(clients["owner"], run, {"note": "no MLflow run yet"})
    assert sent == []
    Run.objects.filter(pk=run.pk).update(mlflow_run_id="abc123")
    with django_capture_on_commit_callbacks(execute=True):
        patch(clients["owner"], run, {"note": "now"})
    assert sent == [("workers.tasks.sync_run_notes", run.pk)]
