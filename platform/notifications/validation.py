"""Input rules of webhooks and e-mail subscriptions: one definition for the REST API and the
settings page (the API's serializers also refuse keys they do not know)."""

from __future__ import annotations

from rest_framework import serializers

from ascent.validators import plain_text
from notifications import signing
from notifications.choices import Event, WebhookFormat
from notifications.models import STALL_DEFAULT, STALL_MINUTES

EVENTS_HELP = ("Event names: " + ", ".join(Event.values) + " (a run's end, failure, "
               "cancellation, preemption, or no training step for `stall_minutes`).")


class EventsField(serializers.ListField):
    def __init__(self, **kwargs):
        super().__init__(child=serializers.ChoiceField(choices=Event.choices), min_length=1,
                         max_length=len(Event.values), help_text=EVENTS_HELP, **kwargs)

    def to_internal_value(self, data):
        return sorted(set(super().to_internal_value(data)))


class WebhookInput(serializers.Serializer):
    """A webhook as its project's owners give it (`allow_local` only from staff)."""

    name = serializers.CharField(max_length=100, validators=[plain_text])
    url = serializers.URLField(max_length=2000, help_text="http or https; its host may not "
                               "resolve to a loopback or link-local address unless allow_local.")
    format = serializers.ChoiceField(choices=WebhookFormat.choices, default=WebhookFormat.JSON)
    events = EventsField()
    stall_minutes = serializers.IntegerField(min_value=STALL_MINUTES[0],
                                             max_value=STALL_MINUTES[1], default=STALL_DEFAULT)
    active = serializers.BooleanField(default=True)
    allow_local = serializers.BooleanField(
        default=False, help_text="Platform administrators only: the URL may be on a loopback "
        "or link-local address (a receiver on the platform's own hosts).")

    def validate(self, attrs):
        request = self.context.get("request")
        instance = self.instance
        allow_local = attrs.get("allow_local", getattr(instance, "allow_local", False))
        if "allow_local" in attrs and attrs["allow_local"] != getattr(instance, "allow_local",
                                                                     False):
            if not (request and request.user.is_staff):
                raise serializers.ValidationError({"allow_local": [
                    "Only platform administrators (staff) may allow a loopback or link-local "
                    "address."]})
        url = attrs.get("url", getattr(instance, "url", None))
        if url and ("url" in attrs or "allow_local" in attrs):
            problem = signing.url_problem(url, allow_local=allow_local)
            if problem:
                raise serializers.ValidationError({"url": [problem]})
        return attrs


class EmailSubscriptionInput(serializers.Serializer):
    """The events of a project's runs you want an e-mail about (an empty list: none)."""

    events = serializers.ListField(child=serializers.ChoiceField(choices=Event.choices),
                                   max_length=len(Event.values), help_text=EVENTS_HELP)
    stall_minutes = serializers.IntegerField(min_value=STALL_MINUTES[0],
                                             max_value=STALL_MINUTES[1], default=STALL_DEFAULT)

    def validate_events(self, events):
        return sorted(set(events))
