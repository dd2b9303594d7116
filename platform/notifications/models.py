"""Webhooks of a project, each user's e-mail subscriptions, and every delivery made."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from accounts.models import Project
from ascent.validators import plain_text
from experiments.models import Run
from notifications.choices import DeliveryState, WebhookFormat

STALL_MINUTES = (1, 7 * 24 * 60)  # the bounds of a subscription's stall threshold
STALL_DEFAULT = 30


def new_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


class Webhook(models.Model):
    """An HTTP endpoint told of the project's runs' events, each request signed with HMAC-SHA256
    of its body under `secret` (shown once, when the webhook is made)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhooks")
    name = models.CharField(max_length=100, validators=[plain_text])
    url = models.URLField(max_length=2000)
    format = models.CharField(max_length=8, choices=WebhookFormat.choices,
                              default=WebhookFormat.JSON)
    events = models.JSONField(default=list, help_text="Event names (notifications.choices.Event).")
    stall_minutes = models.PositiveIntegerField(
        default=STALL_DEFAULT,
        validators=[MinValueValidator(STALL_MINUTES[0]), MaxValueValidator(STALL_MINUTES[1])])
    secret = models.CharField(max_length=80, default=new_secret, editable=False)
    allow_local = models.BooleanField(
        default=False, help_text="May point at a loopback or link-local address (staff only).")
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "name", "id"]
        constraints = [models.UniqueConstraint(fields=["project", "name"],
                                               name="unique_webhook_name")]

    def __str__(self) -> str:
        return f"{self.project}: {self.name}"


class EmailSubscription(models.Model):
    """A user's wish to get an e-mail on some events of a project's runs."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="email_subscriptions")
    project = models.ForeignKey(Project, on_delete=models.CASCADE,
                                related_name="email_subscriptions")
    events = models.JSONField(default=list)
    stall_minutes = models.PositiveIntegerField(
        default=STALL_DEFAULT,
        validators=[MinValueValidator(STALL_MINUTES[0]), MaxValueValidator(STALL_MINUTES[1])])

    class Meta:
        ordering = ["user", "project"]
        constraints = [models.UniqueConstraint(fields=["user", "project"],
                                               name="unique_email_subscription")]


class Delivery(models.Model):
    """One notification to one webhook or e-mail address, tried until delivered or out of
    tries; the row is written in the transaction of the event, so none is lost."""

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, null=True, blank=True,
                                related_name="deliveries")
    email = models.EmailField(blank=True)
    event = models.CharField(max_length=32)
    run = models.ForeignKey(Run, on_delete=models.SET_NULL, null=True, blank=True,
                            related_name="+")
    payload = models.JSONField()
    state = models.CharField(max_length=16, choices=DeliveryState.choices,
                             default=DeliveryState.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    last_status = models.PositiveIntegerField(null=True, blank=True,
                                              help_text="The HTTP status of the last try.")
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.event} to {self.webhook or self.email} ({self.state})"


class StallNotice(models.Model):
    """A stall already told to one recipient: run `run` logged no step after `step` (-1: none
    yet) for longer than the recipient's threshold. A step logged later ends the stall; the
    next stall is told again."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    step = models.IntegerField()
    recipient = models.CharField(max_length=300, help_text="webhook:<id> or email:<address>")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step", "recipient"],
                                               name="one_notice_per_stall")]
