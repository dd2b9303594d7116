"""People join a project only by accepting an owner's invitation, and inviting reveals nothing
about which usernames exist."""

from __future__ import annotations

from django.test import Client

from accounts.models import Invitation

MEMBERS = "/api/v1/projects/{}/members/"


def invite(clients, project, username, role="maintainer", as_="owner"):
    return clients[as_].post(MEMBERS.format(project.pk), {"username": username, "role": role}, format="json")


def test_it_makes_a_member_only_when_the_invitee_accepts(clients, project, users):
    response = invite(clients, project, "stranger")
    assert response.status_code == 202
    body = response.json()
    assert (body["username"], body["role"], body["state"], body["invited_by"]) == (
        "stranger", "maintainer", "pending", "owner")
    assert project.role_of(users["stranger"]) is None

    mine = clients["stranger"].get("/api/v1/invitations/").json()
    assert [(i["id"], i["project_name"]) for i in mine] == [(body["id"], "alpha")]
    accepted = clients["stranger"].post(f"/api/v1/invitations/{body['id']}/accept/")
    assert accepted.status_code == 200 and accepted.json()["role"] == "maintainer"
    assert project.role_of(users["stranger"]) == "maintainer"
    assert Invitation.objects.get().state == "accepted"
    assert clients["stranger"].get("/api/v1/invitations/").json() == []
    again = clients["stranger"].post(f"/api/v1/invitations/{body['id']}/accept/")
    assert again.status_code == 404  # answered invitations are no longer listed


def test_a_declined_invitation_makes_no_member(clients, project, users):
    pk = invite(clients, project, "stranger").json()["id"]
    response = clients["stranger"].post(f"/api/v1/invitations/{pk}/decline/")
    assert response.status_code == 200 and response.json()["state"] == "declined"
    assert project.role_of(users["stranger"]) is None


def test_a_stranger_cannot_accept_someone_elses_invitation(clients, project, users):
    pk = invite(clients, project, "stranger").json()["id"]
    for persona in ("viewer", "maintainer", "admin"):
        assert clients[persona].post(f"/api/v1/invitations/{pk}/accept/").status_code == 404
    assert clients["anonymous"].post(f"/api/v1/invitations/{pk}/accept/").status_code == 401
    assert Invitation.objects.get().state == "pending"
    assert project.role_of(users["stranger"]) is None


def test_an_unknown_username_is_answered_like_a_known_one(clients, project):
    known, unknown = invite(clients, project, "stranger"), invite(clients, project, "nobody-here")
    assert known.status_code == unknown.status_code == 202
    def strip(body):
        return {k: v for k, v in body.items() if k not in ("id", "username", "created_at")}

    assert strip(known.json()) == strip(unknown.json())


def test_owners_list_and_withdraw_pending_invitations(clients, project, users):
    pk = invite(clients, project, "stranger").json()["id"]
    listed = clients["owner"].get(f"/api/v1/projects/{project.pk}/invitations/").json()
    assert [i["username"] for i in listed] == ["stranger"]
    assert clients["viewer"].get(f"/api/v1/projects/{project.pk}/invitations/").status_code == 403
    assert clients["owner"].delete(f"/api/v1/projects/{project.pk}/invitations/{pk}/").status_code == 204
    assert clients["owner"].get(f"/api/v1/projects/{project.pk}/invitations/").json() == []
    assert clients["stranger"].post(f"/api/v1/invitations/{pk}/accept/").status_code == 404
    assert project.role_of(users["stranger"]) is None


def test_inviting_again_updates_the_pending_invitation(clients, project):
    first = invite(clients, project, "stranger", role="viewer").json()
    second = invite(clients, project, "stranger", role="maintainer").json()
    assert first["id"] == second["id"] and second["role"] == "maintainer"
    assert Invitation.objects.count() == 1


def test_members_cannot_be_invited_and_only_owners_invite(clients, project):
    again = invite(clients, project, "viewer")
    assert again.status_code == 409 and "already a member" in again.json()["detail"]
    assert invite(clients, project, "stranger", as_="maintainer").status_code == 403
    assert invite(clients, project, "stranger", as_="stranger").status_code == 404
    assert not Invitation.objects.exists()


def test_the_settings_page_declines_and_withdraws(project, users):
    owner, stranger = Client(), Client()
    owner.force_login(users["owner"])
    stranger.force_login(users["stranger"])
    owner.post(f"/settings/projects/{project.pk}/members/", {"op": "add", "username": "stranger",
                                                              "role": "viewer"})
    first = Invitation.objects.get()
    html = stranger.post(f"/settings/invitations/{first.pk}/decline/", follow=True).content.decode()
    assert "Declined the invitation to alpha." in html and 'data-testid="invitations"' not in html
    assert project.role_of(users["stranger"]) is None

    owner.post(f"/settings/projects/{project.pk}/members/", {"op": "add", "username": "stranger",
                                                              "role": "viewer"})
    second = Invitation.objects.get(state="pending")
    # Only the invitee answers: for anyone else the invitation does not exist.
    assert owner.post(f"/settings/invitations/{second.pk}/accept/").status_code == 404
    html = owner.post(f"/settings/projects/{project.pk}/members/",
                      {"op": "withdraw", "invitation": second.pk}, follow=True).content.decode()
    assert "Withdrew the invitation of stranger." in html
    html = stranger.post(f"/settings/invitations/{second.pk}/accept/", follow=True).content.decode()
    assert "This invitation is already withdrawn." in html
    assert project.role_of(users["stranger"]) is None


def test_an_owner_sends_at_most_the_invite_rate_through_the_api_and_the_page(clients, project,
                                                                             users, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "invite": "3/hour"}}
    assert [invite(clients, project, f"guest{i}").status_code for i in range(3)] == [202] * 3
    refused = invite(clients, project, "guest3")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert refused.json()["error"] == "throttled"
    page = Client()
    page.force_login(users["owner"])  # the settings page counts against the same limit
    html = page.post(f"/settings/projects/{project.pk}/members/",
                     {"op": "add", "username": "guest4", "role": "viewer"}, follow=True)
    assert "Could not invite guest4: too many invitations sent" in html.content.decode()
    assert sorted(Invitation.objects.values_list("username", flat=True)) == [
        "guest0", "guest1", "guest2"]
    # A refused member (a maintainer) spends none of the owner's allowance, nor their own.
    assert invite(clients, project, "guest5", as_="maintainer").status_code == 403


def test_a_project_holds_at_most_the_pending_limit_of_invitations(clients, project, settings):
    settings.ASCENT_INVITATIONS_PENDING_MAX = 2
    assert invite(clients, project, "guest0").status_code == 202
    assert invite(clients, project, "guest1").status_code == 202
    full = invite(clients, project, "guest2")
    assert full.status_code == 409
    assert "already has 2 pending invitations" in full.json()["detail"]
    assert "ASCENT_INVITATIONS_PENDING_MAX" in full.json()["detail"]
    # Changing the role of one already invited is no new invitation.
    assert invite(clients, project, "guest1", role="viewer").status_code == 202
    withdrawn = Invitation.objects.get(username="guest0")
    assert clients["owner"].delete(
        f"/api/v1/projects/{project.pk}/invitations/{withdrawn.pk}/").status_code in (200, 204)
    assert invite(clients, project, "guest2").status_code == 202
