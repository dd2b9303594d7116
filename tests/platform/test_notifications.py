"""Notifications over real PostgreSQL: a project's webhooks (signed requests to a local
receiver, retried after a 500, their deliveries listed), your e-mails (Django's locmem backend)
and stalled runs; the settings page does the same as the API."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from audit.models import AuditEntry
from experiments.models import Run
from experiments.services import transition
from notifications import services, signing
from notifications.models import Delivery, EmailSubscription, StallNotice, Webhook
from tests.stack import WebhookReceiver as Receiver


@pytest.fixture
def receiver():
    made = []

    def make(statuses=()):
        made.append(Receiver(statuses))
        return made[-1]

    yield make
    for r in made:
        r.close()


def hooks_url(project) -> str:
    return f"/api/v1/projects/{project.pk}/webhooks/"


def make_run(experiment, state="RUNNING", **fields) -> Run:
    return Run.objects.create(experiment=experiment, spec={}, algorithm="grpo", device_type="npu",
                              device_count=1, state=state, name="lr-sweep", **fields)


def test_owners_add_a_webhook_whose_secret_is_shown_once(clients, project, receiver):
    local = receiver()
    body = {"name": "team", "url": local.url, "events": ["run.failed", "run.succeeded"]}
    refused = clients["owner"].post(hooks_url(project), body, format="json")
    assert refused.status_code == 400
    message = {e["field"]: e["message"] for e in refused.json()["errors"]}["url"]
    assert "resolves to 127.0.0.1, a loopback" in message and "allow_local" in message
    not_staff = clients["owner"].post(hooks_url(project), {**body, "allow_local": True},
                                      format="json")
    assert {e["field"] for e in not_staff.json()["errors"]} == {"allow_local"}
    assert clients["maintainer"].post(hooks_url(project), body, format="json").status_code == 403
    created = clients["admin"].post(hooks_url(project), {**body, "allow_local": True},
                                    format="json")
    assert created.status_code == 201, created.json()
    secret = created.json()["secret"]
    assert secret.startswith("whsec_") and secret == Webhook.objects.get().secret
    listed = clients["viewer"].get(hooks_url(project)).json()
    assert [h["name"] for h in listed] == ["team"] and "secret" not in listed[0]
    one = clients["viewer"].get(f"{hooks_url(project)}{listed[0]['id']}/").json()
    assert "secret" not in one and one["events"] == ["run.failed", "run.succeeded"]
    assert AuditEntry.objects.filter(action="project.webhook_create").count() == 1
    bad = clients["admin"].post(hooks_url(project), {"name": "x", "url": "ftp://a/b",
                                                     "events": ["run.exploded"]}, format="json")
    fields = {e["field"] for e in bad.json()["errors"]}
    assert fields == {"url", "events.0"}, bad.json()


def test_a_failed_run_is_posted_signed_and_retried_after_a_500(clients, project, experiment,
                                                              receiver):
    local = receiver(statuses=[500])
    hook = Webhook.objects.create(project=project, name="team", url=local.url,
                                  events=["run.failed"], allow_local=True)
    run = make_run(experiment)
    transition(run, "SUCCEEDED", actor="system:test")  # not asked for: nothing
    assert not Delivery.objects.exists()
    run = make_run(experiment)
    Run.objects.filter(pk=run.pk).update(error="RuntimeError: out of memory")
    transition(run, "FAILED", actor="system:test", message="attempt 1 failed")
    delivery = Delivery.objects.get()
    assert (delivery.event, delivery.run_id, delivery.state) == ("run.failed", run.pk, "pending")

    assert services.deliver_due() == [delivery.pk]
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("pending", 1, 500)
    assert delivery.next_attempt_at > timezone.now() + timedelta(seconds=8)  # 10 s later
    assert services.deliver_due() == []  # not due yet
    assert services.deliver_due(now=timezone.now() + timedelta(seconds=11)) == [delivery.pk]
    delivery.refresh_from_db()
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("delivered", 2, 200)

    assert len(local.requests) == 2
    sent = local.requests[-1]
    assert sent["headers"]["X-Ascent-Event"] == "run.failed"
    assert sent["headers"]["X-Ascent-Delivery"] == str(delivery.pk)
    assert signing.verify(hook.secret, sent["headers"]["X-Ascent-Signature"], sent["body"])
    assert not signing.verify("whsec_wrong", sent["headers"]["X-Ascent-Signature"], sent["body"])
    payload = json.loads(sent["body"])
    assert payload["event"] == "run.failed" and payload["detail"] == "attempt 1 failed"
    assert payload["run"]["id"] == run.pk and payload["run"]["state"] == "FAILED"
    assert payload["run"]["error"] == "RuntimeError: out of memory"
    assert payload["run"]["url"].endswith(f"/runs/{run.pk}/")

    listed = clients["viewer"].get(f"{hooks_url(project)}{hook.pk}/deliveries/").json()
    assert [(d["state"], d["attempts"]) for d in listed] == [("delivered", 2)]


def test_a_receiver_that_keeps_failing_ends_failed_and_slack_gets_text(project, experiment,
                                                                       receiver):
    local = receiver(statuses=[503] * signing.MAX_ATTEMPTS)
    Webhook.objects.create(project=project, name="slack", url=local.url, format="slack",
                           events=["run.preempted"], allow_local=True)
    run = make_run(experiment)
    transition(run, "PREEMPTING", actor="system:dispatch", message="preempted for run 9")
    delivery = Delivery.objects.get()
    later = timezone.now()
    for _ in range(signing.MAX_ATTEMPTS):
        later += timedelta(hours=1)
        services.deliver_due(now=later)
    delivery.refresh_from_db()
    assert delivery.state == "failed" and delivery.attempts == signing.MAX_ATTEMPTS
    assert delivery.last_error.startswith("HTTP 503")
    text = json.loads(local.requests[0]["body"])["text"]
    assert text.startswith(f"run {run.pk} (lr-sweep) in alpha/baseline: run preempted")
    assert text.endswith(f"/runs/{run.pk}/>")


def test_a_member_gets_an_email_through_the_mail_backend(clients, users, project, experiment):
    users["owner"].email = "owner@example.com"
    users["owner"].save()
    refused = clients["owner"].put("/api/v1/me/notifications/", [
        {"project": project.pk + 999, "events": ["run.failed"]}], format="json")
    assert refused.status_code == 400
    saved = clients["owner"].put("/api/v1/me/notifications/", [
        {"project": project.pk, "events": ["run.failed", "run.failed"], "stall_minutes": 15}],
        format="json")
    assert saved.status_code == 200, saved.json()
    assert saved.json() == [{"project": project.pk, "project_name": "alpha",
                             "events": ["run.failed"], "stall_minutes": 15}]
    run = make_run(experiment)
    Run.objects.filter(pk=run.pk).update(error="ValueError: bad reward", progress_step=7,
                                         planned_steps=100)
    transition(run, "FAILED", actor="system:test")
    services.deliver_due()
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["owner@example.com"]
    assert message.subject == f"[Ascent] run {run.pk} (lr-sweep) in alpha/baseline: run failed"
    assert "Last step: 7 of 100" in message.body and "Why: ValueError: bad reward" in message.body
    assert Delivery.objects.get().state == "delivered"
    # A member removed from the project gets nothing more.
    project.memberships.filter(user=users["owner"]).delete()
    transition(make_run(experiment), "FAILED", actor="system:test")
    assert Delivery.objects.count() == 1


def test_a_stalled_run_is_told_once_per_stall(project, experiment, users, receiver):
    users["viewer"].email = "viewer@example.com"
    users["viewer"].save()
    EmailSubscription.objects.create(user=users["viewer"], project=project,
                                     events=["run.stalled"], stall_minutes=30)
    local = receiver()
    Webhook.objects.create(project=project, name="pager", url=local.url, events=["run.stalled"],
                           stall_minutes=60, allow_local=True)
    now = timezone.now()
    run = make_run(experiment, started_at=now - timedelta(hours=2), progress_step=12,
                   progress_at=now - timedelta(minutes=45))
    make_run(experiment, started_at=now - timedelta(hours=2), progress_step=3,
             progress_at=now - timedelta(minutes=5))  # busy: no stall
    assert services.find_stalls(now) == 1  # 45 min: the e-mail (30), not the webhook (60)
    assert services.find_stalls(now) == 0  # told already
    assert services.find_stalls(now + timedelta(minutes=20)) == 1  # 65 min: now the webhook
    Run.objects.filter(pk=run.pk).update(progress_step=13, progress_at=now)
    # 40 min later: this run's new stall (e-mail again), and the other run's first (45 min)
    assert services.find_stalls(now + timedelta(minutes=40)) == 2
    assert StallNotice.objects.filter(run=run).count() == 3
    services.deliver_due(now=now + timedelta(hours=1))
    assert [m.to for m in mail.outbox] == [["viewer@example.com"]] * 3
    assert "no training step for 45 minutes (last step: 12)" in mail.outbox[0].body
    assert json.loads(local.requests[0]["body"])["event"] == "run.stalled"


def test_the_settings_page_adds_tests_and_deletes_a_webhook(signed_in, project, users, receiver):
    local = receiver()
    page = signed_in("admin")
    response = page.post(f"/settings/projects/{project.pk}/webhooks/", {
        "name": "team", "url": local.url, "events": ["run.failed", "run.stalled"],
        "allow_local": "1"}, follow=True)
    html = response.content.decode()
    hook = Webhook.objects.get()
    assert hook.events == ["run.failed", "run.stalled"] and hook.allow_local
    assert hook.secret in html and 'data-testid="new-webhook-secret"' in html
    assert hook.secret not in page.get("/settings/").content.decode()  # shown once
    owner = signed_in("owner")
    refused = owner.post(f"/settings/projects/{project.pk}/webhooks/", {
        "name": "mine", "url": local.url, "events": ["run.failed"]}, follow=True)
    assert "resolves to 127.0.0.1, a loopback" in refused.content.decode()
    owner.post(f"/settings/projects/{project.pk}/webhooks/{hook.pk}/ping/")
    services.deliver_due()
    assert json.loads(local.requests[0]["body"])["event"] == "ping"
    shown = owner.get("/settings/").content.decode()
    assert "delivered</span> ping" in shown
    viewer = signed_in("viewer").get("/settings/").content.decode()
    assert 'data-testid="webhook-team"' in viewer and "Delete the webhook" not in viewer
    owner = signed_in("owner")  # one client: signing in as the viewer signed the owner out
    deleted = owner.post(f"/settings/projects/{project.pk}/webhooks/{hook.pk}/delete/",
                         follow=True)
    shown = deleted.content.decode()
    assert "Deleted the webhook team." in shown, shown[shown.find('class="messages"'):][:600]
    assert not Webhook.objects.exists()
    saved = owner.post(f"/settings/projects/{project.pk}/email/",
                       {"events": ["run.succeeded"], "stall_minutes": "20"}, follow=True)
    assert "You will get an e-mail" in saved.content.decode()
    assert EmailSubscription.objects.get(user=users["owner"]).events == ["run.succeeded"]


def test_you_set_your_email_address_in_the_api_and_on_the_page(clients, signed_in, users):
    answer = clients["viewer"].patch("/api/v1/me/", {"email": "not an address"}, format="json")
    assert answer.status_code == 400 and answer.json()["errors"][0]["field"] == "email"
    answer = clients["viewer"].patch("/api/v1/me/", {"email": "viewer@example.com"},
                                     format="json")
    assert answer.status_code == 200 and answer.json()["email"] == "viewer@example.com"
    assert clients["viewer"].get("/api/v1/me/").json()["email"] == "viewer@example.com"
    page = signed_in("owner")
    bad = page.post("/settings/email/", {"email": "nope"}, follow=True).content.decode()
    assert "Could not save your e-mail address: Enter a valid email address." in bad
    page.post("/settings/email/", {"email": " owner@example.com "})
    users["owner"].refresh_from_db()
    assert users["owner"].email == "owner@example.com"
    assert AuditEntry.objects.filter(action="user.email_change").count() == 2
