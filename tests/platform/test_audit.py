"""The audit log: every write through the API (bearer tokens), the web UI (sessions) and the admin
is recorded once with its actor, object, project and address; failures and dry runs are not;
sign-ins are; staff read it at /api/v1/audit/ and /audit/; old entries are purged."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.http import JsonResponse
from django.test import Client
from django.urls import include, path
from django.utils import timezone

from accounts.models import ApiToken, Project
from audit.models import AuditEntry
from clusters.models import Cluster
from experiments.choices import RunState
from experiments.models import Run
from experiments.services import Submission, submit_run, transition


def writes():
    """Entries other than sign-in events (test clients sign in by themselves)."""
    return AuditEntry.objects.exclude(action__startswith="auth.")


def the_entry(action, actor, object_type, object_id, project=None, auth="token") -> AuditEntry:
    """The one write recorded, checked against what is expected."""
    entries = list(writes())
    assert len(entries) == 1, [(e.action, e.object_id) for e in entries]
    entry = entries[0]
    assert (entry.action, entry.actor_name, entry.object_type, entry.object_id) == (
        action, actor, object_type, str(object_id))
    assert entry.actor is not None and entry.actor.username == actor
    assert entry.project_id == (project.pk if project else None)
    assert entry.ip == "127.0.0.1"
    assert entry.auth_method.startswith("token asc_") if auth == "token" else entry.auth_method == auth
    return entry


@pytest.fixture(autouse=True)
def _fresh_rate_limits():
    """Token-creation limits count per user id in the cache, which outlives a test's database."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def run(experiment, users, tiny_spec) -> Run:
    made, _ = submit_run(experiment, users["owner"], Submission(spec=tiny_spec))
    return made


# --- runs through the API -------------------------------------------------------------------

def test_it_records_a_submit_with_the_new_runs_id(submit, project):
    response = submit(as_="maintainer")
    assert response.status_code == 201
    entry = the_entry("run.submit", "maintainer", "run", response.json()["id"], project)
    assert (entry.method, entry.path, entry.status) == ("POST", "/api/v1/runs/", 201)
    assert entry.object_repr == f"run {response.json()['id']}"


def test_it_records_a_repeated_idempotent_submit_once(clients, experiment, tiny_spec):
    body = {"experiment": experiment.pk, "spec": tiny_spec}
    for _ in range(2):
        clients["owner"].post("/api/v1/runs/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert writes().filter(action="run.submit").count() == 1


def test_it_does_not_record_a_dry_run(clients, tiny_spec, project):
    response = clients["owner"].post("/api/v1/runs/validate/", {"spec": tiny_spec}, format="json")
    assert response.status_code == 200
    assert not writes().exists()


def test_it_records_cancel_clone_and_restart(clients, run, project, settings, tmp_path):
    settings.ASCENT_RUNS_DIR = tmp_path
    assert clients["maintainer"].post(f"/api/v1/runs/{run.pk}/cancel/").status_code == 200
    the_entry("run.cancel", "maintainer", "run", run.pk, project)

    AuditEntry.objects.all().delete()
    clone = clients["owner"].post(f"/api/v1/runs/{run.pk}/clone/", {}, format="json").json()
    assert the_entry("run.clone", "owner", "run", clone["id"], project).details == {"from_run": run.pk}

    AuditEntry.objects.all().delete()
    restart = clients["owner"].post(f"/api/v1/runs/{run.pk}/restart/").json()
    assert the_entry("run.restart", "owner", "run", restart["id"], project).details == {"from_run": run.pk}


@pytest.mark.parametrize(("persona", "status"), [("viewer", 403), ("stranger", 404), ("anonymous", 401)])
def test_it_records_no_refused_write(clients, run, persona, status):
    assert clients[persona].post(f"/api/v1/runs/{run.pk}/cancel/").status_code == status
    assert not writes().exists()


def test_it_records_no_invalid_submit(submit):
    assert submit(spec={"algorithm": "grpo", "actor": {"lr": -1}}).status_code == 400
    assert not writes().exists()


def test_it_records_a_conflicting_write_as_nothing(clients, run):
    for state in (RunState.SCHEDULED, RunState.STARTING, RunState.RUNNING, RunState.SUCCEEDED):
        transition(run.pk, state, actor="system:test")
    assert clients["owner"].post(f"/api/v1/runs/{run.pk}/cancel/").status_code == 409
    assert not writes().exists()


# --- members, tokens, clusters and nodes through the API ------------------------------------

def test_it_records_member_invite_role_change_and_removal(clients, project):
    base = f"/api/v1/projects/{project.pk}/members/"
    response = clients["owner"].post(base, {"username": "stranger", "role": "viewer"}, format="json")
    assert response.status_code in (201, 202)
    entry = writes().get()
    assert entry.action == {201: "member.add", 202: "member.invite"}[response.status_code]
    assert entry.object_id == "stranger"
    assert (entry.project_id, entry.details) == (project.pk, {"username": "stranger", "role": "viewer"})

    AuditEntry.objects.all().delete()
    assert clients["owner"].patch(f"{base}viewer/", {"role": "maintainer"}, format="json").status_code == 200
    entry = the_entry("member.role_change", "owner", "member", "viewer", project)
    assert (entry.details, entry.object_repr) == ({"role": "maintainer"}, "viewer in alpha")

    AuditEntry.objects.all().delete()
    assert clients["owner"].delete(f"{base}maintainer/").status_code == 204
    the_entry("member.remove", "owner", "member", "maintainer", project)


def test_it_records_invitation_answers_and_withdrawals(clients, login, project):
    invite = f"/api/v1/projects/{project.pk}/members/"
    ids = []
    for username in ("stranger", "admin", "nobody"):
        clients["owner"].post(invite, {"username": username, "role": "viewer"}, format="json")
        ids.append(_invitation_id(project, username))
    AuditEntry.objects.all().delete()
    assert clients["stranger"].post(f"/api/v1/invitations/{ids[0]}/accept/").status_code == 200
    the_entry("invitation.accept", "stranger", "invitation", ids[0], project)

    AuditEntry.objects.all().delete()
    login("admin").post(f"/settings/invitations/{ids[1]}/decline/")
    the_entry("invitation.decline", "admin", "invitation", ids[1], project, auth="session")

    AuditEntry.objects.all().delete()
    assert clients["owner"].delete(f"/api/v1/projects/{project.pk}/invitations/{ids[2]}/").status_code == 204
    the_entry("invitation.withdraw", "owner", "invitation", ids[2], project)


def _invitation_id(project, username) -> int:
    return project.invitations.get(username=username).pk


def test_it_records_project_and_experiment_writes(clients, project, experiment):
    created = clients["viewer"].post("/api/v1/projects/", {"name": "beta"}, format="json").json()
    beta = type(project).objects.get(pk=created["id"])
    the_entry("project.create", "viewer", "project", beta.pk, beta)
    AuditEntry.objects.all().delete()
    clients["owner"].patch(f"/api/v1/projects/{project.pk}/", {"description": "x"}, format="json")
    entry = the_entry("project.update", "owner", "project", project.pk, project)
    assert entry.details == {"fields": ["description"]}
    AuditEntry.objects.all().delete()
    assert clients["viewer"].delete(f"/api/v1/projects/{beta.pk}/").status_code == 204
    entry = the_entry("project.delete", "viewer", "project", beta.pk)  # the project is gone
    assert entry.object_repr == "beta"

    AuditEntry.objects.all().delete()
    response = clients["maintainer"].post("/api/v1/experiments/", {"project": project.pk, "name": "new"},
                                          format="json")
    the_entry("experiment.create", "maintainer", "experiment", response.json()["id"], project)
    AuditEntry.objects.all().delete()
    assert clients["maintainer"].delete(f"/api/v1/experiments/{response.json()['id']}/").status_code == 204
    assert the_entry("experiment.delete", "maintainer", "experiment", response.json()["id"], project
                     ).object_repr == "alpha/new"


def test_it_records_token_creation_and_revocation_without_the_token(clients):
    response = clients["viewer"].post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert response.status_code == 201
    created = response.json()
    entry = the_entry("token.create", "viewer", "token", created["id"])
    assert entry.details["name"] == "ci"
    stored = json.dumps([list(e.__dict__.values()) for e in AuditEntry.objects.all()], default=str)
    assert created["token"] not in stored and created["token"][12:] not in stored

    AuditEntry.objects.all().delete()
    assert clients["viewer"].delete(f"/api/v1/tokens/{created['id']}/").status_code == 204
    assert "ci (" in the_entry("token.revoke", "viewer", "token", created["id"]).object_repr


def test_it_records_cluster_create_update_and_delete(clients, cluster):
    response = clients["admin"].post("/api/v1/clusters/", {"name": "gpu-x", "device_type": "gpu",
                                                            "ray_address": "http://x:8265"}, format="json")
    assert response.status_code == 201
    assert the_entry("cluster.create", "admin", "cluster", response.json()["id"]).object_repr == "gpu-x"

    AuditEntry.objects.all().delete()
    clients["admin"].patch(f"/api/v1/clusters/{cluster.pk}/", {"labels": {"zone": "b"}}, format="json")
    assert the_entry("cluster.update", "admin", "cluster", cluster.pk).details == {"fields": ["labels"]}

    AuditEntry.objects.all().delete()
    assert clients["admin"].delete(f"/api/v1/clusters/{cluster.pk}/").status_code == 204
    assert the_entry("cluster.delete", "admin", "cluster", cluster.pk).object_repr == "npu-a"


def test_it_records_node_create_update_drain_undrain_and_delete(clients, cluster):
    admin, node = clients["admin"], cluster.nodes.get()
    new_node = {"cluster": "npu-a", "hostname": "n9", "device_type": "ascend-910c", "device_count": 16,
                "healthy_device_count": 16}
    response = admin.post("/api/v1/nodes/", new_node, format="json")
    assert response.status_code == 201
    the_entry("node.create", "admin", "node", response.json()["id"])
    for method, url, action in (("patch", f"/api/v1/nodes/{node.pk}/", "node.update"),
                                ("post", f"/api/v1/nodes/{node.pk}/drain/", "node.drain"),
                                ("post", f"/api/v1/nodes/{node.pk}/undrain/", "node.undrain"),
                                ("delete", f"/api/v1/nodes/{node.pk}/", "node.delete")):
        AuditEntry.objects.all().delete()
        assert getattr(admin, method)(url, {"healthy_device_count": 7}, format="json").status_code < 300
        assert the_entry(action, "admin", "node", node.pk).object_repr == "n1 (npu-a)"


def test_it_records_no_write_refused_to_non_staff(clients, cluster):
    assert clients["owner"].post(f"/api/v1/nodes/{cluster.nodes.get().pk}/drain/").status_code == 403
    assert not writes().exists()


# --- the web UI (a signed-in test client) ---------------------------------------------------

def test_it_records_ui_cancel_and_restart_with_the_session(login, run, project, settings, tmp_path):
    settings.ASCENT_RUNS_DIR = tmp_path
    client = login("maintainer")
    assert client.post(f"/runs/{run.pk}/cancel/").status_code == 302
    the_entry("run.cancel", "maintainer", "run", run.pk, project, auth="session")

    AuditEntry.objects.all().delete()
    client.post(f"/runs/{run.pk}/restart/")
    restart = Run.objects.get(cloned_from=run)
    entry = the_entry("run.restart", "maintainer", "run", restart.pk, project, auth="session")
    assert (entry.method, entry.path, entry.status) == ("POST", f"/runs/{run.pk}/restart/", 302)


def test_it_records_ui_submit_but_not_its_dry_run(login, experiment, project):
    client = login("owner")
    form = {"experiment": experiment.pk, "key": "k1", "mode": "form", "algorithm": "grpo",
            "spec.data.synthetic.task": "addition"}
    assert client.post("/runs/new/", {**form, "action": "dry_run"}).status_code == 200
    assert not writes().exists()
    assert client.post("/runs/new/", {**form, "action": "submit"}).status_code == 302
    the_entry("run.submit", "owner", "run", Run.objects.get().pk, project, auth="session")


def test_it_records_no_ui_write_the_page_refused(login, run, cluster):
    assert login("viewer").post(f"/runs/{run.pk}/cancel/").status_code == 302  # with an error message
    assert login("owner").post(f"/clusters/nodes/{cluster.nodes.get().pk}/drain/").status_code == 302
    assert login("owner").post("/settings/tokens/", {"name": " ", "expires_in_days": "7"}).status_code == 200
    assert not writes().exists()


def test_it_records_ui_member_add_role_change_and_removal(login, project, users):
    client, url = login("owner"), f"/settings/projects/{project.pk}/members/"
    client.post(url, {"op": "add", "username": "stranger", "role": "viewer"})
    entry = writes().get()
    assert entry.action in ("member.add", "member.invite") and entry.object_id == "stranger"
    assert (entry.actor_name, entry.project_id, entry.auth_method) == ("owner", project.pk, "session")
    assert entry.details == {"username": "stranger", "role": "viewer"}
    for op, role, action in (("role", "owner", "member.role_change"), ("remove", "", "member.remove")):
        AuditEntry.objects.all().delete()
        client.post(url, {"op": op, "username": "viewer", "role": role})
        the_entry(action, "owner", "member", "viewer", project, auth="session")
    AuditEntry.objects.all().delete()
    client.post(url, {"op": "remove", "username": "nobody"})  # refused with a message
    assert not writes().exists()


def test_it_records_ui_token_creation_and_revocation(login, users):
    client = login("owner")
    html = client.post("/settings/tokens/", {"name": "ci", "expires_in_days": "7"},
                       follow=True).content.decode()
    token = ApiToken.objects.get(name="ci")
    entry = the_entry("token.create", "owner", "token", token.pk, auth="session")
    assert entry.details == {"name": "ci", "expires_in_days": "7"} and token.prefix in html

    AuditEntry.objects.all().delete()
    client.post(f"/settings/tokens/{token.pk}/revoke/")
    the_entry("token.revoke", "owner", "token", token.pk, auth="session")


def test_it_records_ui_drain_and_undrain(login, cluster):
    client, node = login("admin"), cluster.nodes.get()
    for action in ("drain", "undrain"):
        AuditEntry.objects.all().delete()
        client.post(f"/clusters/nodes/{node.pk}/{action}/")
        the_entry(f"node.{action}", "admin", "node", node.pk, auth="session")


# --- the admin, unknown endpoints, origins, robustness --------------------------------------

def test_it_mirrors_admin_changes_and_bulk_actions(login, users, cluster):
    users["admin"].is_superuser = True
    users["admin"].save()
    client, node = login("admin"), cluster.nodes.get()
    client.post("/admin/clusters/node/", {"action": "drain", "_selected_action": [node.pk]})
    node.refresh_from_db()
    assert node.state == "draining"
    entry = the_entry("node.drain", "admin", "node", node.pk, auth="session")
    assert entry.details == {"via": "admin"}

    AuditEntry.objects.all().delete()
    response = client.post(f"/admin/clusters/cluster/{cluster.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302 and not Cluster.objects.exists()
    entry = the_entry("cluster.delete", "admin", "cluster", cluster.pk, auth="session")
    assert entry.object_repr == "npu-a" and entry.details["via"] == "admin"


def _poke(request, pk):
    return JsonResponse({"poked": pk}, status=201)


urlpatterns = [path("api/v1/widgets/<int:pk>/poke/", _poke, name="widget-poke"),
               path("", include("ascent.urls"))]


@pytest.mark.urls(__name__)
def test_it_records_an_unknown_write_endpoint_generically(db, users):
    client = Client()
    client.force_login(users["owner"])
    assert client.post("/api/v1/widgets/7/poke/").status_code == 201
    entry = writes().get()
    assert (entry.action, entry.object_id, entry.actor_name) == ("unmapped.post", "7", "owner")
    assert entry.details == {"view": "widget-poke", "kwargs": {"pk": "7"}}


def test_it_takes_the_proxys_address_only_behind_a_proxy(clients, run, settings):
    forwarded = {"HTTP_X_FORWARDED_FOR": "203.0.113.9, 198.51.100.4", "HTTP_USER_AGENT": "ci/1 " + "x" * 400}
    clients["owner"].post(f"/api/v1/runs/{run.pk}/clone/", {}, format="json", **forwarded)
    entry = writes().get()
    assert entry.ip == "127.0.0.1" and entry.user_agent == ("ci/1 " + "x" * 400)[:256]
    settings.ASCENT_BEHIND_PROXY = True
    AuditEntry.objects.all().delete()
    clients["owner"].post(f"/api/v1/runs/{run.pk}/clone/", {}, format="json", **forwarded)
    assert writes().get().ip == "198.51.100.4"  # the address the proxy added, not the client's claim


@pytest.fixture
def audit_refuses_writes():
    """The audit table refuses every new row (a real database error, as a full disk or a lost
    connection would give) until the test ends."""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE audit_auditentry ADD CONSTRAINT test_no_entries "
                       "CHECK (false) NOT VALID")
    yield
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE audit_auditentry DROP CONSTRAINT test_no_entries")


def test_a_write_whose_entry_cannot_be_stored_is_not_kept(clients, run, audit_refuses_writes):
    """A write and its entry are one transaction: no write is kept without its entry."""
    state = run.state
    response = clients["owner"].post(f"/api/v1/runs/{run.pk}/cancel/")
    assert response.status_code == 503
    assert response.json() == {"error": "audit_unavailable", "detail": (
        "The change could not be recorded in the audit log, so it was not made: try again "
        "shortly.")}
    run.refresh_from_db()
    assert run.state == state and not run.events.filter(to_state="CANCELLED").exists()
    created = clients["owner"].post("/api/v1/projects/", {"name": "ghost"}, format="json")
    assert created.status_code == 503 and not Project.objects.filter(name="ghost").exists()
    assert not AuditEntry.objects.exists()


def test_the_actors_name_stays_when_the_user_is_deleted(clients, run, users):
    clients["maintainer"].post(f"/api/v1/runs/{run.pk}/cancel/")
    users["maintainer"].delete()
    entry = writes().get()
    assert (entry.actor, entry.actor_name) == (None, "maintainer")


# --- sign-in events -------------------------------------------------------------------------

def test_it_records_sign_in_failure_success_and_sign_out(users):
    users["owner"].set_password("correct horse battery")
    users["owner"].save()
    client = Client()
    client.post("/sign-in/", {"username": "owner", "password": "wrong-secret-1"})
    failed = AuditEntry.objects.get(action="auth.login_failed")
    assert (failed.actor, failed.actor_name, failed.ip) == (None, "owner", "127.0.0.1")
    assert "wrong-secret-1" not in json.dumps(failed.details) + failed.object_repr + failed.path

    response = client.post("/sign-in/", {"username": "owner", "password": "correct horse battery"})
    assert response.status_code == 302
    login = AuditEntry.objects.get(action="auth.login")
    assert (login.actor, login.ip, login.path, login.auth_method) == (
        users["owner"], "127.0.0.1", "/sign-in/", "session")
    client.post("/sign-out/")
    assert AuditEntry.objects.get(action="auth.logout").actor == users["owner"]
    assert not writes().exists()  # the sign-in and sign-out forms are not also recorded as writes


# --- reading the log ------------------------------------------------------------------------

@pytest.mark.parametrize(("persona", "status"), [("admin", 200), ("owner", 403), ("maintainer", 403),
                                                 ("viewer", 403), ("stranger", 403), ("anonymous", 401)])
def test_only_staff_read_the_audit_log(clients, persona, status):
    response = clients[persona].get("/api/v1/audit/")
    assert response.status_code == status
    if status >= 400:
        assert {"error", "detail"} <= set(response.json())


def test_the_audit_log_is_newest_first_and_read_only(clients, run):
    clients["owner"].post(f"/api/v1/runs/{run.pk}/cancel/")
    clients["owner"].post(f"/api/v1/runs/{run.pk}/clone/", {}, format="json")
    body = clients["admin"].get("/api/v1/audit/?page_size=1").json()
    assert [e["action"] for e in body["results"]] == ["run.clone"] and body["next"]
    older = clients["admin"].get(body["next"]).json()["results"]
    assert older[0]["action"] == "run.cancel" and older[0]["actor"] == "owner"
    assert clients["admin"].post("/api/v1/audit/", {}, format="json").status_code == 405
    assert clients["admin"].delete(f"/api/v1/audit/{older[0]['id']}/").status_code == 405


def test_the_audit_log_filters(clients, run, project, users):
    clients["owner"].post(f"/api/v1/runs/{run.pk}/cancel/")
    clients["viewer"].post("/api/v1/tokens/", {"name": "ci"}, format="json")
    old = AuditEntry.objects.create(action="run.cancel", actor_name="owner",
                                    created_at=timezone.now() - timedelta(days=3))
    admin = clients["admin"]

    def actions(query):
        response = admin.get(f"/api/v1/audit/?{query}")
        assert response.status_code == 200, response.json()
        return sorted(e["action"] for e in response.json()["results"] if not e["action"].startswith("auth."))

    assert actions("actor=viewer") == ["token.create"]
    assert actions("action=run.cancel") == ["run.cancel", "run.cancel"]
    assert actions("action=token.") == ["token.create"]
    assert actions(f"object_type=run&object_id={run.pk}") == ["run.cancel"]
    assert actions(f"project={project.pk}") == ["run.cancel"]
    cutoff = (timezone.now() - timedelta(days=1)).isoformat().replace("+00:00", "Z")
    assert actions(f"created_before={cutoff}") == ["run.cancel"] and old.pk
    assert "run.cancel" in actions(f"created_after={cutoff}")
    bad = admin.get("/api/v1/audit/?created_after=yesterday")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "created_after"


def test_the_openapi_document_describes_the_audit_log(clients):
    import yaml

    document = yaml.safe_load(clients["viewer"].get("/api/schema/").content)
    listing = document["paths"]["/api/v1/audit/"]["get"]
    assert {"200", "400", "401", "403"} <= set(listing["responses"])
    names = {p["name"] for p in listing["parameters"]}
    assert {"actor", "action", "object_type", "object_id", "project", "created_after",
            "created_before"} <= names


# --- retention ------------------------------------------------------------------------------

def _aged(days: int) -> AuditEntry:
    return AuditEntry.objects.create(action="run.cancel", created_at=timezone.now() - timedelta(days=days))


def test_the_daily_task_purges_only_entries_past_the_retention(db, settings):
    from workers.tasks import purge_audit_log

    settings.ASCENT_AUDIT_RETENTION_DAYS = 30
    old, recent = _aged(31), _aged(29)
    assert purge_audit_log() == 1
    assert list(AuditEntry.objects.values_list("pk", flat=True)) == [recent.pk]
    assert old.pk not in AuditEntry.objects.values_list("pk", flat=True)
    assert "workers.tasks.purge_audit_log" in {e["task"] for e in settings.CELERY_BEAT_SCHEDULE.values()}


def test_retention_zero_keeps_everything(db, settings):
    from workers.tasks import purge_audit_log

    settings.ASCENT_AUDIT_RETENTION_DAYS = 0
    _aged(5000)
    assert purge_audit_log() == 0 and AuditEntry.objects.count() == 1


def test_the_purge_command_uses_the_retention_or_days(db, settings, capsys):
    settings.ASCENT_AUDIT_RETENTION_DAYS = 365
    _aged(400), _aged(100), _aged(1)
    call_command("purge_audit_log")
    assert "Deleted 1 audit entries older than 365 days." in capsys.readouterr().out
    call_command("purge_audit_log", "--days", "30")
    assert AuditEntry.objects.count() == 1


# --- the page -------------------------------------------------------------------------------

@pytest.mark.parametrize("persona", ["owner", "maintainer", "viewer", "stranger"])
def test_the_audit_page_is_not_found_for_non_staff(login, project, persona):
    client = login(persona)
    assert client.get("/audit/").status_code == 404
    assert 'data-testid="nav-audit"' not in client.get("/").content.decode()


def test_the_audit_page_lists_and_filters_entries_for_staff(login, clients, run, project):
    clients["owner"].post(f"/api/v1/runs/{run.pk}/cancel/")
    clients["viewer"].post("/api/v1/tokens/", {"name": "ci"}, format="json")
    client = login("admin")
    html = client.get("/audit/").content.decode()
    assert 'data-testid="nav-audit"' in html and 'data-testid="audit-table"' in html
    assert "<code>run.cancel</code>" in html and "<code>token.create</code>" in html
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)  # the Content-Security-Policy
    assert not re.search(r"<[^>]+\s(style|on[a-z]+)=", html, re.IGNORECASE)
    filtered = client.get("/audit/?actor=viewer").content.decode()
    assert "<code>token.create</code>" in filtered and "<code>run.cancel</code>" not in filtered
    empty = client.get("/audit/?action=cluster.delete").content.decode()
    assert 'data-testid="no-audit-entries"' in empty


def test_the_audit_page_pages_through_entries_keeping_the_filters(login, db):
    AuditEntry.objects.bulk_create(AuditEntry(action="run.cancel", object_type="run", object_id=str(i))
                                   for i in range(60))
    client = login("admin")
    first = client.get("/audit/?action=run.cancel").content.decode()
    assert first.count('data-testid="audit-row-') == 50 and "page 1 of 2" in first
    assert 'href="?action=run.cancel&amp;page=2"' in first
    second = client.get("/audit/?action=run.cancel&page=2").content.decode()
    assert second.count('data-testid="audit-row-') == 10
