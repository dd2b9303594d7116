"""Input serializers that refuse keys they do not know, with a "did you mean" hint."""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers


def unknown_key_message(key: str, known: list[str]) -> str:
    """What to say about a body key that no field takes."""
    close = difflib.get_close_matches(str(key), known, n=1)
    if close:
        return f"Unknown key: did you mean {close[0]!r}?"
    return f"Unknown key: expected one of {', '.join(known)}." if known else "Unknown key: send {}."


class StrictInputMixin:
    """Refuse body keys that are not writable fields: unknown ones (with the closest known key)
    and read-only ones (the server sets those). Mix in before the DRF serializer class."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            errors = self.refused_keys(data)
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)

    def refused_keys(self, data: Mapping) -> dict[str, list[str]]:
        writable = sorted(name for name, field in self.fields.items() if not field.read_only)
        read_only = {name for name, field in self.fields.items() if field.read_only}
        errors = {}
        for key in data:
            if key == "csrfmiddlewaretoken":  # the browsable API's forms send it
                continue
            if key in read_only:
                errors[str(key)] = ["Read-only: the server sets it; leave it out of the body."]
            elif key not in writable:
                errors[str(key)] = [unknown_key_message(key, writable)]
        return errors


class StrictSerializer(StrictInputMixin, serializers.Serializer):
    """A plain input serializer that refuses unknown keys."""


class StrictModelSerializer(StrictInputMixin, serializers.ModelSerializer):
    """A model serializer that refuses unknown and read-only keys in its input."""


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(serializers.JSONField):
    """A JSON object (not null, a list or a scalar), documented as one."""

    default_error_messages = {"not_object": "Must be a JSON object."}

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if not isinstance(value, dict):
            self.fail("not_object")
        return value
