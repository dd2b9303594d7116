"""From a run's event to its deliveries, and from a due delivery to a request or an e-mail.

A run that ends (SUCCEEDED, FAILED, CANCELLED) or is preempted writes a RunEvent; `on_run_event`
(connected to its post_save) writes one Delivery per interested recipient in the same
transaction — the project's active webhooks that ask for the event, and the e-mail
subscriptions of its members — so no notification is lost if the worker is down. The worker's
`deliver_notifications` task (`deliver_due`) sends due deliveries: a webhook gets a signed POST
(signing.py) and counts as delivered on a 2xx answer, else it is tried again after 10 s, 30 s,
90 s, … (`signing.MAX_ATTEMPTS` tries); an e-mail goes through Django's mail backend
(`EMAIL_BACKEND`); a worker that dies while sending leaves the delivery to be tried again
after `LEASE_S`. `find_stalls` (every minute) notices RUNNING runs that logged no step for a
recipient's `stall_minutes`.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta

import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from experiments.choices import RunState
from experiments.models import Run, RunEvent
from notifications import signing
from notifications.choices import PING, STATE_EVENTS, DeliveryState, Event, WebhookFormat
from notifications.models import STALL_DEFAULT, Delivery, EmailSubscription, StallNotice, Webhook

log = logging.getLogger("ascent.notifications")
TIMEOUT_S = 10.0
LEASE_S = 120  # a claimed delivery is due again after this if its worker died mid-way
ERROR_CHARS = 500


# --------------------------------------------------------------------------- events


def on_run_event(sender, instance: RunEvent, created: bool, **kwargs) -> None:
    """post_save of a RunEvent: notify when the run ended or was preempted."""
    event = STATE_EVENTS.get(instance.to_state)
    if created and event is not None:
        notify(Run.objects.select_related("experiment__project").get(pk=instance.run_id),
               event, instance.message)


def notify(run: Run, event: str, detail: str = "", *, only: list[str] | None = None) -> int:
    """Write the deliveries of `event` about `run` (`only`: these recipients, by StallNotice
    key); returns how many. The worker is told after the transaction commits."""
    project = run.experiment.project
    made = 0
    for hook in Webhook.objects.filter(project=project, active=True):
        if event in hook.events and (only is None or f"webhook:{hook.pk}" in only):
            Delivery.objects.create(webhook=hook, event=event, run=run,
                                    payload=payload(hook.format, event, run, detail),
                                    next_attempt_at=timezone.now())
            made += 1
    for sub in (EmailSubscription.objects.filter(project=project, user__memberships__project=project)
                .select_related("user")):
        email = sub.user.email
        if event in sub.events and email and (only is None or f"email:{email}" in only):
            Delivery.objects.create(email=email, event=event, run=run,
                                    payload=payload("email", event, run, detail),
                                    next_attempt_at=timezone.now())
            made += 1
    if made:
        transaction.on_commit(_wake_worker)
    return made


def ping(hook: Webhook) -> Delivery:
    """A test delivery to the webhook (event `ping`), sent by the worker like any other."""
    body = {"event": PING, "webhook": hook.name, "project": hook.project.name,
            "occurred_at": timezone.now().isoformat()}
    if hook.format == WebhookFormat.SLACK:
        body = {"text": f"Ascent: webhook {hook.name} of project {hook.project.name} works."}
    delivery = Delivery.objects.create(webhook=hook, event=PING, payload=body,
                                       next_attempt_at=timezone.now())
    transaction.on_commit(_wake_worker)
    return delivery


def _wake_worker() -> None:
    from experiments.services import notify_worker

    notify_worker("workers.tasks.deliver_notifications")


def run_url(run: Run) -> str:
    return f"{settings.ASCENT_PUBLIC_URL.rstrip('/')}/runs/{run.pk}/"


def payload(kind: str, event: str, run: Run, detail: str) -> dict:
    """The body of a delivery: `json` (the run as the API shows its main fields), `slack` (a
    `text` message), or `email` (subject and text)."""
    project, experiment = run.experiment.project.name, run.experiment.name
    label = f"run {run.pk}" + (f" ({run.name})" if run.name else "")
    what = Event(event).label if event in Event.values else event
    reason = run.error or detail
    headline = f"{label} in {project}/{experiment}: {what}"
    if kind == WebhookFormat.SLACK:
        return {"text": f"{headline}" + (f": {reason}" if reason else "") + f" <{run_url(run)}>"}
    if kind == "email":
        lines = [headline[0].upper() + headline[1:] + ".", "", f"State: {run.state}"]
        if run.progress_step is not None:
            lines.append(f"Last step: {run.progress_step}" + (
                f" of {run.planned_steps}" if run.planned_steps else ""))
        if reason:
            lines.append(f"Why: {reason}")
        lines += ["", run_url(run)]
        return {"subject": f"[Ascent] {headline}", "text": "\n".join(lines)}
    return {
        "event": event,
        "occurred_at": timezone.now().isoformat(),
        "detail": detail,
        "run": {"id": run.pk, "name": run.name, "state": run.state, "project": project,
                "experiment": experiment, "algorithm": run.algorithm, "error": run.error,
                "progress_step": run.progress_step, "planned_steps": run.planned_steps,
                "mlflow_run_id": run.mlflow_run_id, "url": run_url(run)},
    }


# --------------------------------------------------------------------------- stalls


def find_stalls(now=None) -> int:
    """Notify recipients asking for `run.stalled` of RUNNING runs that logged no step for their
    `stall_minutes` (counted from the last step, or from the start when none yet); each stall
    once per recipient. Returns the deliveries written."""
    now = now or timezone.now()
    made = 0
    running = Run.objects.filter(state=RunState.RUNNING).select_related("experiment__project")
    for run in running:
        since = run.progress_at or run.started_at
        if since is None:
            continue
        quiet = (now - since).total_seconds() / 60
        step = run.progress_step if run.progress_step is not None else -1
        due = [f"webhook:{hook.pk}" for hook in
               Webhook.objects.filter(project=run.experiment.project_id, active=True)
               if Event.STALLED in hook.events and quiet >= hook.stall_minutes]
        due += [f"email:{sub.user.email}" for sub in
                EmailSubscription.objects.filter(project=run.experiment.project_id)
                .select_related("user")
                if Event.STALLED in sub.events and quiet >= sub.stall_minutes and sub.user.email]
        with transaction.atomic():
            fresh = [key for key in due if StallNotice.objects.get_or_create(
                run=run, step=step, recipient=key)[1]]
            if fresh:
                made += notify(run, Event.STALLED, f"no training step for {int(quiet)} minutes "
                               f"(last step: {run.progress_step if step >= 0 else 'none yet'})",
                               only=fresh)
    return made


# --------------------------------------------------------------------------- delivery


def deliver_due(now=None, limit: int = 100) -> list[int]:
    """Send the pending deliveries whose time has come (each by one worker: rows are locked and
    skipped by the others); returns their ids."""
    now = now or timezone.now()
    with transaction.atomic():  # claim them: another worker skips them until the lease ends
        due = list(Delivery.objects.select_for_update(skip_locked=True, of=("self",))
                   .filter(state=DeliveryState.PENDING, next_attempt_at__lte=now)
                   .select_related("webhook__project").order_by("next_attempt_at", "id")[:limit])
        Delivery.objects.filter(pk__in=[d.pk for d in due]).update(
            next_attempt_at=now + timedelta(seconds=LEASE_S))
    for delivery in due:  # outside the transaction: a slow receiver holds no lock
        _attempt(delivery)
    return [delivery.pk for delivery in due]


def _attempt(delivery: Delivery) -> None:
    status, error = None, ""
    try:
        if delivery.webhook is not None:
            status, error = _post(delivery)
        else:
            send_mail(delivery.payload["subject"], delivery.payload["text"],
                      settings.DEFAULT_FROM_EMAIL, [delivery.email])
    except Exception as exc:  # noqa: BLE001 - any failure of one delivery is its own
        error = f"{type(exc).__name__}: {exc}"
    delivery.attempts += 1
    delivery.last_status, delivery.last_error = status, error[:ERROR_CHARS]
    now = timezone.now()
    if not error:
        delivery.state, delivery.delivered_at = DeliveryState.DELIVERED, now
    elif delivery.attempts >= signing.MAX_ATTEMPTS:
        delivery.state = DeliveryState.FAILED
    else:
        delivery.next_attempt_at = now + timedelta(
            seconds=signing.retry_delay_s(delivery.attempts))
    delivery.save(update_fields=["attempts", "last_status", "last_error", "state",
                                 "delivered_at", "next_attempt_at"])


def _post(delivery: Delivery) -> tuple[int | None, str]:
    """(HTTP status, error text or "") of one signed POST to the delivery's webhook."""
    hook = delivery.webhook
    problem = signing.url_problem(hook.url, allow_local=hook.allow_local)
    if problem:
        return None, f"not sent: {problem}"
    body = json.dumps(delivery.payload, sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Ascent-Webhooks/1",
        "X-Ascent-Event": delivery.event,
        "X-Ascent-Delivery": str(delivery.pk),
        "X-Ascent-Signature": signing.signature(hook.secret, int(time.time()), body),
    }
    try:
        response = requests.post(hook.url, data=body, headers=headers, timeout=TIMEOUT_S,
                                 allow_redirects=False)
    except requests.RequestException as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if 200 <= response.status_code < 300:
        return response.status_code, ""
    return response.status_code, f"HTTP {response.status_code}: {response.text[:200]}"


# --------------------------------------------------------------------------- settings


def create_webhook(project, user, data: dict) -> Webhook:
    """A webhook of `project` from checked input (validation.WebhookInput); its secret is new."""
    return Webhook.objects.create(project=project, created_by=user, **data)


def update_webhook(hook: Webhook, data: dict) -> Webhook:
    for name, value in data.items():
        setattr(hook, name, value)
    hook.save()
    return hook


def subscriptions_of(user) -> list[dict]:
    """The user's e-mail subscriptions, one per project they are a member of (an empty event
    list where they asked for none)."""
    mine = {sub.project_id: sub for sub in EmailSubscription.objects.filter(user=user)}
    result = []
    for membership in user.memberships.select_related("project").order_by("project__name"):
        sub = mine.get(membership.project_id)
        result.append({"project": membership.project_id, "project_name": membership.project.name,
                       "events": sub.events if sub else [],
                       "stall_minutes": sub.stall_minutes if sub else STALL_DEFAULT})
    return result


def set_email(user, email: str) -> None:
    """The address a user's notification e-mails go to (checked input; "" for none)."""
    get_user_model().objects.filter(pk=user.pk).update(email=email)
    user.email = email


@transaction.atomic
def set_subscriptions(user, items: list[dict]) -> None:
    """Store the user's subscriptions (checked input; projects they are a member of)."""
    for item in items:
        if item["events"]:
            EmailSubscription.objects.update_or_create(
                user=user, project_id=item["project"],
                defaults={"events": item["events"], "stall_minutes": item["stall_minutes"]})
        else:
            EmailSubscription.objects.filter(user=user, project_id=item["project"]).delete()
