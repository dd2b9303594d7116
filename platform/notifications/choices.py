"""What a notification is about, and how far a delivery got."""

from django.db import models


class Event(models.TextChoices):
    """A run's moment that people may hear of (the run's state it stands for)."""

    SUCCEEDED = "run.succeeded", "run succeeded"
    FAILED = "run.failed", "run failed"
    CANCELLED = "run.cancelled", "run cancelled"
    PREEMPTED = "run.preempted", "run preempted"
    STALLED = "run.stalled", "run stalled (no step for a while)"


# The run state whose event each notification stands for (a stall has none).
STATE_EVENTS = {"SUCCEEDED": Event.SUCCEEDED, "FAILED": Event.FAILED,
                "CANCELLED": Event.CANCELLED, "PREEMPTING": Event.PREEMPTED}
PING = "ping"  # a test delivery to a webhook


class DeliveryState(models.TextChoices):
    PENDING = "pending", "pending"  # not sent yet, or sent and to be tried again
    DELIVERED = "delivered", "delivered"
    FAILED = "failed", "failed"  # every try failed; no more tries


class WebhookFormat(models.TextChoices):
    JSON = "json", "JSON (signed)"
    SLACK = "slack", "Slack-compatible (a text message, signed)"
