"""The dashboard, clusters and settings pages through Django's test client: what each persona
sees, and that the page actions follow the same rules as the REST API."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken, Membership, Project
from clusters.models import Node
from experiments.models import Attempt, Experiment, Run


def section(html: str, testid: str) -> str:
    """The markup of the element with this data-testid, up to the end of its <section>."""
    start = html.index(f'data-testid="{testid}"')
    return html[start:html.index("</section>", start)]


def make_run(experiment, state="QUEUED", **fields) -> Run:
    return Run.objects.create(experiment=experiment, spec={}, algorithm="grpo", device_type="npu",
                              device_count=8, state=state, **fields)


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.mark.parametrize("url", ["/", "/clusters/", "/settings/"])
def test_anonymous_visitors_are_sent_to_sign_in(client, db, url):
    response = client.get(url)
    assert response.status_code == 302 and response["Location"] == f"/sign-in/?next={url}"


# --- dashboard ------------------------------------------------------------------------------

def test_the_dashboard_sorts_the_users_runs_into_sections(login, experiment, cluster):
    now = timezone.now()
    queued = make_run(experiment, name="waits", waiting_reason="No cluster has 8 free npu devices.")
    running = make_run(experiment, "RUNNING", name="trains", started_at=now)
    Attempt.objects.create(run=running, number=1, ray_submission_id="r1", cluster=cluster, device_count=8)
    failed = make_run(experiment, "FAILED", name="broke", finished_at=now,
                      error="RuntimeError: NPU out of memory\n  at step 12")
    old = make_run(experiment, "FAILED", name="ancient", finished_at=now - timedelta(days=8))
    other = Experiment.objects.create(project=Project.objects.create(name="beta"), name="secret")
    hidden = make_run(other, name="not-yours")

    html = login("viewer").get("/").content.decode()
    queue, live, failures = section(html, "queue"), section(html, "running"), section(html, "failures")
    assert f'href="/runs/{queued.pk}/"' in queue and "No cluster has 8 free npu devices." in queue
    assert f'href="/runs/{running.pk}/"' in live and "npu-a" in live  # the cluster of its attempt
    assert f'href="/runs/{failed.pk}/"' in failures
    assert '>RuntimeError: NPU out of memory</span>' in failures  # its first line (all of it on hover)
    assert f"/runs/{old.pk}/" not in html and f"/runs/{hidden.pk}/" not in html and "not-yours" not in html
    # The counts link to the runs list filtered by state.
    assert re.search(r'href="/runs/\?state=QUEUED" data-testid="count-queued">\s*<div class="value">1<', html)
    assert 'href="/runs/?state=FAILED"' in html
    # Utilisation: the attempt holds 8 of the cluster's 8 NPUs.
    utilisation = section(html, "utilisation")
    assert 'data-testid="utilisation-npu-a"' in utilisation
    assert re.search(r'<b class="used">8</b> used · <b class="free">0</b> free · 8 total', utilisation)


def test_the_dashboard_of_a_new_user_says_what_to_do(login, project):
    html = login("stranger").get("/").content.decode()
    assert 'data-testid="no-runs"' in html and 'href="/runs/new/"' in html
    assert "Nothing is running" in html and "The queue is empty" in html
    assert "No cluster is registered" in html


def test_htmx_gets_only_the_live_partial(login, experiment):
    run = make_run(experiment, "STARTING")
    response = login("owner").get("/", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert "<html" not in html and 'data-testid="running"' in html and f"/runs/{run.pk}/" in html
    assert 'data-testid="failures"' not in html
    assert "HX-Request" in response["Vary"]


# --- clusters -------------------------------------------------------------------------------

def test_the_clusters_page_lists_clusters_and_nodes(login, cluster):
    Node.objects.create(cluster=cluster, hostname="n2", device_type="ascend-910b", device_count=8,
                        healthy_device_count=6, cpu_count=192, memory_bytes=2 * 1024**4,
                        last_seen=timezone.now() - timedelta(minutes=3))
    cluster.last_probe_error = "Cannot reach http://head:8265"
    cluster.save()
    html = login("viewer").get("/clusters/").content.decode()
    assert 'data-testid="cluster-npu-a"' in html and "http://head:8265" in html
    assert "Cannot reach http://head:8265" in html
    n2 = section(html, "cluster-npu-a").split('data-testid="node-n2"')[1].split("</tr>")[0]
    assert 'class="num health-bad"' in n2 and "6 of 8" in n2 and "2.0\xa0TB" in n2
    assert "3\xa0minutes ago" in n2 and 'title="20' in n2  # the exact time on hover
    assert "Drain" not in html and "/clusters/nodes/" not in html  # no buttons for non-staff


def test_only_staff_drain_and_undrain_nodes(login, cluster):
    node = cluster.nodes.get()
    url = f"/clusters/nodes/{node.pk}/drain/"
    response = login("owner").post(url, follow=True)
    assert "Only platform administrators" in response.content.decode()
    node.refresh_from_db()
    assert node.state == "ready"

    admin = login("admin")
    assert 'aria-label="Drain n1"' in admin.get("/clusters/").content.decode()
    response = admin.post(url, follow=True)
    assert response.redirect_chain[-1][0] == "/clusters/#cluster-npu-a"
    assert "Node n1 of npu-a drained" in response.content.decode()
    node.refresh_from_db()
    assert node.state == "draining"
    assert 'aria-label="Undrain n1"' in response.content.decode()
    admin.post(f"/clusters/nodes/{node.pk}/undrain/")
    node.refresh_from_db()
    assert node.state == "ready"
    assert admin.post(f"/clusters/nodes/{node.pk}/reboot/").status_code == 404
    assert admin.get(url).status_code == 405


# --- settings: members ----------------------------------------------------------------------

def member_post(client, project, op, username, role=""):
    return client.post(f"/settings/projects/{project.pk}/members/",
                       {"op": op, "username": username, "role": role}, follow=True)


def test_owners_invite_change_and_remove_members(login, project, users):
    owner = login("owner")
    page = owner.get("/settings/").content.decode()
    assert 'data-testid="add-member-alpha"' in page and 'aria-label="Remove viewer"' in page

    response = member_post(owner, project, "add", "stranger", "viewer")
    html = response.content.decode()
    assert "Invited stranger to alpha as viewer: they become a member when they accept." in html
    assert 'data-testid="pending-alpha-stranger"' in html and project.role_of(users["stranger"]) is None

    stranger = login("stranger")
    invitation = project.invitations.get()
    assert 'data-testid="invitation-alpha"' in stranger.get("/settings/").content.decode()
    html = stranger.post(f"/settings/invitations/{invitation.pk}/accept/", follow=True).content.decode()
    assert "You joined alpha as viewer." in html and 'data-testid="member-stranger"' in html
    assert project.role_of(users["stranger"]) == "viewer"

    member_post(owner, project, "role", "stranger", "maintainer")
    assert project.role_of(users["stranger"]) == "maintainer"
    response = member_post(owner, project, "remove", "stranger")
    assert "Removed stranger from alpha." in response.content.decode()
    assert project.role_of(users["stranger"]) is None


def test_the_last_owner_stays(login, project, users):
    owner = login("owner")
    for op, role in (("remove", ""), ("role", "viewer")):
        response = member_post(owner, project, op, "owner", role)
        assert "A project needs an owner" in response.content.decode()
        assert project.role_of(users["owner"]) == "owner"


def test_bad_member_input_is_refused_and_changes_nothing(login, project):
    owner, before = login("owner"), list(Membership.objects.values_list("user__username", "role"))
    html = member_post(owner, project, "add", "nobody", "viewer").content.decode()
    assert "Invited nobody to alpha as viewer" in html  # the same answer as for a real user
    html = member_post(owner, project, "add", "stranger", "emperor").content.decode()
    assert "&quot;emperor&quot; is not a valid choice." in html
    html = member_post(owner, project, "role", "viewer", "emperor").content.decode()
    assert "is not a valid choice" in html
    html = member_post(owner, project, "add", "viewer", "owner").content.decode()
    assert "viewer is already a member" in html
    html = member_post(owner, project, "remove", "stranger").content.decode()
    assert "stranger is not a member of alpha." in html
    assert list(Membership.objects.values_list("user__username", "role")) == before


def test_viewers_see_members_but_cannot_change_them(login, project, users):
    viewer = login("viewer")
    html = viewer.get("/settings/").content.decode()
    assert 'data-testid="member-owner"' in html and 'data-testid="member-maintainer"' in html
    assert "/members/" not in html and "<select" not in html  # no member forms at all
    response = member_post(viewer, project, "add", "stranger", "owner")
    assert "Only the project&#x27;s owners may manage its members." in response.content.decode()
    assert project.role_of(users["stranger"]) is None
    member_post(viewer, project, "remove", "owner")
    assert project.role_of(users["owner"]) == "owner"
    # A stranger does not even learn that the project exists.
    assert member_post(login("stranger"), project, "add", "stranger", "owner").status_code == 404


def test_staff_manage_every_project(login, project, users):
    Project.objects.create(name="beta")
    html = login("admin").get("/settings/").content.decode()
    assert 'data-testid="project-beta"' in html and 'data-testid="add-member-alpha"' in html
    member_post(login("admin"), project, "role", "viewer", "maintainer")
    assert project.role_of(users["viewer"]) == "maintainer"


# --- settings: tokens -----------------------------------------------------------------------

def test_a_new_token_is_shown_once_and_works(login, users, settings):
    settings.ASCENT_TOKEN_DEFAULT_DAYS = 30
    owner = login("owner")
    assert 'name="expires_in_days" value="30"' in owner.get("/settings/").content.decode()
    response = owner.post("/settings/tokens/", {"name": "ci", "expires_in_days": ""})
    # post/redirect/get: the browser lands on a GET, so a reload sends nothing again
    assert response.status_code == 302 and response["Location"] == "/settings/#tokens"
    html = owner.get(response["Location"]).content.decode()
    raw = re.search(r'data-testid="new-token">(asc_[^<]+)<', html).group(1)
    assert "shown only this once" in html and 'data-copy="#new-token"' in html
    token = ApiToken.objects.get(user=users["owner"], name="ci")
    assert timedelta(days=29) < token.expires_at - timezone.now() <= timedelta(days=30)  # the default
    assert bearer(raw).get("/api/v1/me/").json()["username"] == "owner"

    html = owner.get("/settings/").content.decode()  # the reload
    assert raw not in html and 'data-testid="token-ci"' in html and token.prefix in html
    assert ApiToken.objects.filter(user=users["owner"]).count() == 1


def test_an_active_token_name_cannot_be_given_twice(login, users, clients):
    owner = login("owner")
    owner.post("/settings/tokens/", {"name": "ci", "expires_in_days": "7"})
    html = owner.post("/settings/tokens/", {"name": "ci", "expires_in_days": "7"}).content.decode()
    assert "You already have an active token named &#x27;ci&#x27;: choose another name" in html
    assert 'name="name" value="ci"' in html  # kept, to be changed
    api = clients["owner"].post("/api/v1/tokens/", {"name": "ci"}, format="json")
    error = api.json()["errors"][0]
    assert api.status_code == 400 and error["field"] == "name"
    assert "already have an active token named 'ci'" in error["message"]
    # another user may use the name, and so may the owner once the first is revoked
    assert login("viewer").post("/settings/tokens/", {"name": "ci", "expires_in_days": "7"}).status_code == 302
    ApiToken.objects.get(user=users["owner"], name="ci").revoke()
    assert owner.post("/settings/tokens/", {"name": "ci", "expires_in_days": "7"}).status_code == 302
    assert ApiToken.objects.filter(user=users["owner"], name="ci").count() == 2


def test_a_token_that_never_expires_only_where_the_server_allows_it(login, users, settings):
    refused = login("owner").post("/settings/tokens/", {"name": "forever", "expires_in_days": "0"})
    html = refused.content.decode()
    assert "Tokens must expire on this server (ASCENT_TOKEN_MAX_DAYS=365)" in html
    assert not ApiToken.objects.filter(name="forever").exists()
    settings.ASCENT_TOKEN_MAX_DAYS = 0
    login("owner").post("/settings/tokens/", {"name": "forever", "expires_in_days": "0"})
    assert ApiToken.objects.get(name="forever").expires_at is None


def test_the_page_refuses_a_lifetime_above_the_maximum(login, users):
    response = login("owner").post("/settings/tokens/", {"name": "long", "expires_in_days": "400"})
    html = response.content.decode()
    assert "At most 365 days (ASCENT_TOKEN_MAX_DAYS)" in html
    assert not ApiToken.objects.filter(name="long").exists()


def test_the_page_limits_how_many_tokens_are_created(login, users, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {
        **settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "token-create": "2/hour"}}
    owner = login("owner")
    for name in ("a", "b"):
        assert owner.post("/settings/tokens/", {"name": name, "expires_in_days": "7"}).status_code == 302
    refused = owner.post("/settings/tokens/", {"name": "c", "expires_in_days": "7"})
    assert refused.status_code == 429 and "Too many new tokens: try again in" in refused.content.decode()
    assert sorted(ApiToken.objects.values_list("name", flat=True)) == ["a", "b"]


def test_revoked_tokens_stop_working_and_stay_listed(login, users):
    token, raw = ApiToken.issue(users["owner"], "old")
    owner = login("owner")
    response = owner.post(f"/settings/tokens/{token.pk}/revoke/", follow=True)
    html = response.content.decode()
    assert "Revoked the token old" in html
    row = html.split('data-testid="token-old"')[1].split("</tr>")[0]
    assert "Revoked" in row and "/revoke/" not in row
    assert bearer(raw).get("/api/v1/me/").status_code == 401
    # Someone else's token is not found, and stays active.
    other, _ = ApiToken.issue(users["viewer"], "theirs")
    assert owner.post(f"/settings/tokens/{other.pk}/revoke/").status_code == 404
    other.refresh_from_db()
    assert other.is_active


def test_bad_token_input_is_refused(login, users):
    owner = login("owner")
    html = owner.post("/settings/tokens/", {"name": "  ", "expires_in_days": "7"}).content.decode()
    assert "This field may not be blank." in html and 'data-testid="new-token"' not in html
    html = owner.post("/settings/tokens/", {"name": "x", "expires_in_days": "-1"}).content.decode()
    assert "Ensure this value is greater than or equal to 0." in html
    assert 'name="name" value="x"' in html  # the form keeps what was typed
    assert not ApiToken.objects.filter(user=users["owner"]).exists()


@pytest.mark.parametrize("query", ["/compare/?runs=²", "/compare/?runs=" + "1" * 25 + ",1",
                                   "/compare/?runs=%2B1,٢", "/compare/precision/?a=²&b=١",
                                   "/compare/precision/?a=" + "9" * 25, "/runs/new/?clone=²",
                                   "/runs/new/?clone=" + "9" * 25, "/audit/?project=²",
                                   "/audit/?project=" + "9" * 25])
def test_ids_in_query_parameters_are_ascii_digits_in_range(login, experiment, users, query):
    """Text that is no id (other digits, 25 of them) is treated as no id, never a 500."""
    users["owner"].is_staff = True
    users["owner"].save()
    response = login("owner").get(query)
    assert response.status_code == 200, response.content[:300]


def test_a_clone_named_in_other_digits_is_not_the_run(login, experiment, users, submit):
    run_id = submit().json()["id"]
    arabic = "".join(chr(0x0660 + int(d)) for d in str(run_id))
    owner = login("owner")
    assert 'data-testid="cloned-from"' in owner.get(f"/runs/new/?clone={run_id}").content.decode()
    assert 'data-testid="cloned-from"' not in owner.get(f"/runs/new/?clone={arabic}").content.decode()
