"""OpenAPI descriptions that drf-spectacular cannot infer on its own.

`AscentAutoSchema` (REST_FRAMEWORK's DEFAULT_SCHEMA_CLASS) adds to every operation the error
responses it can return, marks request bodies closed (unknown keys are refused), read-only
relations to nullable columns as nullable, and describes server-sent event streams.
"""

from __future__ import annotations

from django.core.validators import RegexValidator
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import force_instance
from rest_framework import serializers
from rest_framework.permissions import SAFE_METHODS, AllowAny

from api.strict import StrictInputMixin

BODY_METHODS = ("POST", "PUT", "PATCH")
ERROR_DESCRIPTIONS = {
    "400": "Invalid input; `errors` names each field (or query parameter) and what to send.",
    "401": "No valid credentials: send `Authorization: Bearer <token>`.",
    "403": "Your role does not allow this (or a signed-in form lacks its CSRF token).",
    "404": "No such object, or not visible to you.",
    "409": "Conflicts with the current state.",
    "411": "A chunked body without Content-Length: send Content-Length.",
    "413": "The body exceeds ASCENT_MAX_BODY_BYTES.",
    "415": "Unsupported Content-Type: send application/json.",
    "429": "Too many requests: wait for the seconds in Retry-After.",
}
# One event of the stream (OpenAPI 3.0: a text/event-stream schema describes each event, as
# its fields; OpenAPI 3.2 names that `itemSchema`).
EVENT_STREAM = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "enum": ["log", "end"]},
        "data": {"type": "string", "description": "The event's JSON object, as text."},
    },
    "required": ["event", "data"],
    "description": (
        "Server-sent events. `event: log` with data {\"attempt\": int, \"offset\": int, "
        "\"text\": str} as the log grows (`offset` is where the next read starts); then one "
        "`event: end` with data {\"attempt\": int|null, \"offset\": int, \"state\": RunState} "
        "when the run has finished or the stream's time is up (reconnect with `offset`). "
        "Comment lines (`: keep-alive`) are heartbeats."
    ),
}

# JSON columns whose model validators accept less than "any JSON", by the validator's name.
VALIDATED_JSON = {
    "validate_labels": {"type": "object", "additionalProperties": {"type": "string"}},
    "validate_roots": {"type": "array", "items": {
        "type": "string", "pattern": r"^/(?!(.*/)?\.\.(/|$))",
        "description": "An absolute folder without `..`."}},
}

RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"},
                               "description": "Seconds to wait before retrying."}}


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "accounts.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token: `python manage.py createtoken USER` or POST /api/v1/tokens/.",
        }


class AscentAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema with the API's error responses and closed request bodies."""

    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation["responses"]
        for code in self.error_codes(operation):
            responses.setdefault(code, self._error_response(code))
        if "429" in responses:
            responses["429"].setdefault("headers", {}).update(RETRY_AFTER)
        if "text/event-stream" in responses.get("200", {}).get("content", {}):
            _describe_stream(responses)
        return operation

    def error_codes(self, operation) -> list[str]:
        """The error statuses this operation can answer with."""
        where = {p["in"] for p in operation.get("parameters", [])}
        body = self.method in BODY_METHODS
        authenticated = not all(isinstance(p, AllowAny) for p in self.view.get_permissions())
        codes = {
            "400": body or "query" in where,
            "401": authenticated,
            "403": authenticated and self.method not in SAFE_METHODS,
            "404": "path" in where or self._paginated(operation),
            "409": self.method == "DELETE",
            "411": body, "413": body, "415": body,
            "429": True,
        }
        return [code for code, applies in codes.items() if applies]

    def _paginated(self, operation) -> bool:
        names = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
        return bool(names & {"page", "cursor"})  # an invalid page or cursor is a 404

    def _error_response(self, code: str) -> dict:
        from api.serializers import ErrorSerializer

        ref = self.resolve_serializer(ErrorSerializer, "response").ref
        return {"description": ERROR_DESCRIPTIONS[code], "content": {"application/json": {"schema": ref}}}

    def map_parsers(self):
        """Bodies are documented as JSON; forms are parsed for the browsable API only."""
        media_types = super().map_parsers()
        return [m for m in media_types if m == "application/json"] or media_types

    def _map_basic_serializer(self, serializer, direction):
        schema = super()._map_basic_serializer(serializer, direction)
        if direction == "request" and isinstance(force_instance(serializer), StrictInputMixin):
            schema["additionalProperties"] = False
        return schema

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        schema = super()._map_serializer_field(field, direction, bypass_extensions)
        return schema if schema is None or "$ref" in schema else _refined(field, schema, direction)


def _refined(field, schema: dict, direction: str) -> dict:
    """What a field's schema leaves out: null from a nullable column, both IP versions, the
    shapes that JSON columns' validators require, and that text which may not be blank needs a
    character other than spaces (DRF strips it before checking)."""
    if (direction == "request" and isinstance(field, serializers.CharField)
            and field.trim_whitespace and not field.allow_blank and "pattern" not in schema
            and not any(isinstance(v, RegexValidator) for v in field.validators)):
        schema = {**schema, "pattern": r"\S"}
    if _nullable_relation(field):
        schema = {**schema, "nullable": True}
    if isinstance(field, serializers.IPAddressField) and field.protocol == "both":
        schema = {**schema, "anyOf": [{"format": "ipv4"}, {"format": "ipv6"}]}
    if isinstance(field, serializers.JSONField):
        for validator in field.validators:
            schema = {**schema, **VALIDATED_JSON.get(getattr(validator, "__name__", ""), {})}
    return schema


def _describe_stream(responses: dict) -> None:
    """The event stream of a 200, and errors, which come as JSON text when a stream is asked."""
    for code, response in responses.items():
        if code.startswith(("4", "5")):
            response.setdefault("content", {})["text/event-stream"] = {"schema": {
                "type": "string", "description": "The error shape as JSON text."}}
        elif "text/event-stream" in response.get("content", {}):
            response["content"]["text/event-stream"] = {"schema": EVENT_STREAM}


def _nullable_relation(field) -> bool:
    """A read-only relation whose model column may be NULL (DRF then renders null)."""
    if not isinstance(field, serializers.RelatedField) or not field.read_only:
        return False
    model = getattr(getattr(field.parent, "Meta", None), "model", None)
    if model is None or "." in field.source:
        return False
    try:
        return model._meta.get_field(field.source).null
    except Exception:  # noqa: BLE001 - not a model field: nothing to say
        return False
