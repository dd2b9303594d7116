"""Projects and experiments are created on the settings page, under the same rules as the API:
anyone makes a project and owns it; owners and maintainers add experiments; names are checked
and a refused form comes back with what was typed."""

from __future__ import annotations

import pytest

from accounts.models import Membership, Project
from audit.models import AuditEntry
from experiments.models import Experiment


def test_anyone_creates_a_project_and_becomes_its_owner(signed_in, users):
    client = signed_in("stranger")

    response = client.post("/settings/projects/new/", {"name": "math-rl", "description": "GSM8K"})

    assert response.status_code == 302 and response["Location"] == "/settings/#project-math-rl"
    project = Project.objects.get(name="math-rl")
    assert project.description == "GSM8K"
    assert Membership.objects.get(project=project).user == users["stranger"]
    assert project.can_admin(users["stranger"])
    page = client.get("/settings/").content.decode()
    assert 'data-testid="project-math-rl"' in page and "Created the project math-rl" in page
    entry = AuditEntry.objects.get(action="project.create")
    assert (entry.actor_name, entry.object_id, entry.details) == (
        "stranger", str(project.pk), {"name": "math-rl"})


@pytest.mark.parametrize(("name", "words"), [
    ("alpha", "A project with this name exists already"),
    ("has space", "Use 1-63 lowercase letters, digits and hyphens"),
    ("Upper", "Use 1-63 lowercase letters, digits and hyphens"),
    ("", "This field is required"),
])
def test_a_refused_project_name_comes_back_at_its_field(signed_in, project, name, words):
    response = signed_in("owner").post("/settings/projects/new/", {"name": name, "description": "kept"})

    assert response.status_code == 400
    page = response.content.decode()
    assert words in page and 'id="new-project-name-error"' in page and 'value="kept"' in page
    assert Project.objects.count() == 1 and not AuditEntry.objects.filter(action="project.create")


def test_the_api_and_the_page_refuse_the_same_project_names(signed_in, clients, project):
    for name in ("alpha", "has space", "x" * 64):
        api = clients["owner"].post("/api/v1/projects/", {"name": name}, format="json")
        page = signed_in("owner").post("/settings/projects/new/", {"name": name})
        assert (api.status_code, page.status_code) == (400, 400), name


@pytest.mark.parametrize("persona", ["owner", "maintainer"])
def test_owners_and_maintainers_add_experiments(signed_in, project, users, persona):
    client = signed_in(persona)

    response = client.post(f"/settings/projects/{project.pk}/experiments/",
                           {"name": "grpo-baseline", "description": "the first"})

    assert response.status_code == 302 and response["Location"] == "/settings/#project-alpha"
    experiment = Experiment.objects.get(project=project, name="grpo-baseline")
    assert (experiment.created_by, experiment.description) == (users[persona], "the first")
    page = client.get("/settings/").content.decode()
    assert 'data-testid="experiment-alpha-grpo-baseline"' in page
    submit = client.get("/runs/new/").content.decode()
    assert "alpha/grpo-baseline" in submit  # it can take runs now


def test_a_viewer_gets_no_form_and_is_refused(signed_in, project):
    client = signed_in("viewer")

    assert 'data-testid="new-experiment-alpha"' not in client.get("/settings/").content.decode()
    response = client.post(f"/settings/projects/{project.pk}/experiments/", {"name": "x"}, follow=True)
    assert "Viewers cannot create experiments" in response.content.decode()
    assert not Experiment.objects.filter(project=project).exists()


def test_a_stranger_cannot_add_to_a_project_they_cannot_see(signed_in, project):
    response = signed_in("stranger").post(f"/settings/projects/{project.pk}/experiments/", {"name": "x"})

    assert response.status_code == 404
    assert not Experiment.objects.filter(project=project).exists()


def test_a_taken_experiment_name_comes_back_at_its_field(signed_in, experiment):
    response = signed_in("owner").post(f"/settings/projects/{experiment.project.pk}/experiments/",
                                       {"name": "baseline", "description": "typed"})

    assert response.status_code == 400
    page = response.content.decode()
    assert "alpha already has an experiment named &#x27;baseline&#x27;" in page
    assert 'aria-invalid="true"' in page and 'value="typed"' in page
    assert Experiment.objects.filter(project=experiment.project).count() == 1


def test_the_api_creates_experiments_through_the_same_rule(clients, project):
    made = clients["maintainer"].post("/api/v1/experiments/", {"project": project.pk, "name": "e1"},
                                      format="json")
    refused = clients["viewer"].post("/api/v1/experiments/", {"project": project.pk, "name": "e2"},
                                     format="json")

    assert made.status_code == 201 and made.json()["created_by"] == "maintainer"
    assert refused.status_code == 403 and "Viewers cannot create experiments" in refused.json()["detail"]


def test_a_user_without_projects_is_shown_the_way_to_one(signed_in):
    client = signed_in("stranger")

    assert 'href="/settings/#new-project"' in client.get("/runs/new/").content.decode()
    settings_page = client.get("/settings/").content.decode()
    assert 'id="new-project" open' in settings_page
