"""Projects and their members."""

from __future__ import annotations

from accounts.models import Membership, Project


def test_the_creator_of_a_project_becomes_its_owner(clients, users):
    response = clients["stranger"].post("/api/v1/projects/", {"name": "gamma"}, format="json")
    assert response.status_code == 201 and response.json()["my_role"] == "owner"
    assert Membership.objects.get(project__name="gamma").user == users["stranger"]


def test_a_project_name_is_unique_and_a_slug(clients, project):
    assert clients["owner"].post("/api/v1/projects/", {"name": "alpha"}, format="json").status_code == 400
    assert clients["owner"].post("/api/v1/projects/", {"name": "Alpha Team"}, format="json").status_code == 400
    assert Project.objects.count() == 1


def test_owners_manage_members(clients, project, users):
    owner = clients["owner"]
    url = f"/api/v1/projects/{project.pk}/members/"
    invited = owner.post(url, {"username": "stranger", "role": "viewer"}, format="json")
    assert invited.status_code == 202 and project.role_of(users["stranger"]) is None
    clients["stranger"].post(f"/api/v1/invitations/{invited.json()['id']}/accept/")
    assert project.role_of(users["stranger"]) == "viewer"
    assert clients["stranger"].get(f"/api/v1/projects/{project.pk}/").status_code == 200
    assert owner.patch(f"{url}stranger/", {"role": "maintainer"}, format="json").json()["role"] == "maintainer"
    assert owner.delete(f"{url}stranger/").status_code == 204
    assert clients["stranger"].get(f"/api/v1/projects/{project.pk}/").status_code == 404


def test_member_input_is_checked(clients, project):
    url = f"/api/v1/projects/{project.pk}/members/"
    owner = clients["owner"]
    assert owner.post(url, {"username": "stranger", "role": "emperor"}, format="json").status_code == 400
    assert owner.post(url, {"username": "", "role": "viewer"}, format="json").status_code == 400
    again = owner.post(url, {"username": "viewer", "role": "viewer"}, format="json")
    assert again.status_code == 409 and "already a member" in again.json()["detail"]
    assert owner.patch(f"{url}nobody/", {"role": "viewer"}, format="json").status_code == 404


def test_it_refuses_an_invitation_without_a_role_naming_the_field(clients, project):
    response = clients["owner"].post(f"/api/v1/projects/{project.pk}/members/", {"username": "stranger"},
                                     format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid" and body["errors"][0]["field"] == "role"
    assert "owner, maintainer or viewer" in body["errors"][0]["message"]


def test_the_last_owner_cannot_leave_or_be_demoted(clients, project):
    url = f"/api/v1/projects/{project.pk}/members/owner/"
    assert clients["owner"].delete(url).status_code == 409
    assert clients["owner"].patch(url, {"role": "viewer"}, format="json").status_code == 409
    clients["owner"].patch(f"/api/v1/projects/{project.pk}/members/maintainer/", {"role": "owner"},
                           format="json")
    assert clients["owner"].patch(url, {"role": "viewer"}, format="json").status_code == 200


def test_an_experiment_cannot_move_between_projects(clients, experiment, users):
    other = Project.objects.create(name="other")
    Membership.objects.create(project=other, user=users["owner"], role="owner")
    response = clients["owner"].patch(f"/api/v1/experiments/{experiment.pk}/", {"project": other.pk},
                                      format="json")
    assert response.status_code == 400


def test_experiment_names_are_unique_per_project(clients, experiment, project):
    response = clients["owner"].post("/api/v1/experiments/", {"project": project.pk, "name": "baseline"},
                                     format="json")
    assert response.status_code == 400
    assert "already has an experiment" in response.json()["errors"][0]["message"]


def test_me_lists_my_projects_and_roles(clients, project):
    body = clients["viewer"].get("/api/v1/me/").json()
    assert body["username"] == "viewer" and body["projects"] == [
        {"id": project.pk, "name": "alpha", "role": "viewer"}]


def test_nothing_with_unfinished_runs_can_be_deleted(clients, experiment, project, submit):
    run_id = submit().json()["id"]
    for path in (f"/api/v1/experiments/{experiment.pk}/", f"/api/v1/projects/{project.pk}/"):
        response = clients["owner"].delete(path)
        assert response.status_code == 409 and "1 unfinished run" in response.json()["detail"]
    clients["owner"].post(f"/api/v1/runs/{run_id}/cancel/")
    assert clients["owner"].delete(f"/api/v1/experiments/{experiment.pk}/").status_code == 204
    assert clients["owner"].delete(f"/api/v1/projects/{project.pk}/").status_code == 204
