"""One error shape for every API failure.

    {"error": "<code>", "detail": "<one sentence>", "errors": [{"field": "a.b", "message": "…"}]}

`errors` is present on validation failures; `field` is the dotted path of the input that is
wrong (for a run spec, `spec.` followed by the spec's own field path).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.db.models import ProtectedError
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ascent.errors import DomainError, RequestError
from experiments.tracking import TrackingUnavailable
from rl_core.spec import SpecError

log = logging.getLogger(__name__)

_CODES = {
    400: "invalid",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    411: "length_required",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "throttled",
}


def flatten_errors(detail, prefix: str = "") -> Iterator[dict[str, str]]:
    """DRF's nested error detail as a flat list of {field, message}."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            key = "" if key in ("non_field_errors", "__all__") else str(key)
            yield from flatten_errors(value, f"{prefix}.{key}".strip(".") if key else prefix)
    elif isinstance(detail, list):
        if all(isinstance(item, str) for item in detail):
            for item in detail:
                yield {"field": prefix, "message": str(item)}
        else:
            for index, item in enumerate(detail):
                yield from flatten_errors(item, f"{prefix}.{index}".strip("."))
    else:
        yield {"field": prefix, "message": str(detail)}


def spec_validation_error(exc: SpecError, prefix: str = "spec") -> exceptions.ValidationError:
    """A SpecError as a DRF ValidationError keyed by `spec.<field path>`."""
    detail: dict[str, list[str]] = {}
    for item in exc.errors:
        field = f"{prefix}.{item['field']}".strip(".")
        detail.setdefault(field, []).append(item["message"])
    return exceptions.ValidationError(detail)


class MetricsStoreUnavailable(exceptions.APIException):
    """experiments.tracking.TrackingUnavailable as an API error: 503 with its message."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = TrackingUnavailable.PUBLIC
    default_code = "tracking_unavailable"


def _body(code: str, detail: str, errors: list | None = None) -> dict:
    body = {"error": code, "detail": detail}
    if errors is not None:
        body["errors"] = errors
    return body


def exception_handler(exc, context):
    if isinstance(exc, SpecError):
        exc = spec_validation_error(exc)
    elif isinstance(exc, RequestError):
        exc = exceptions.ValidationError({exc.field: [str(exc)]})
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else exc.messages)
    elif isinstance(exc, TrackingUnavailable):
        # the reason names the store's internal address: it goes to the log, not to the client
        log.warning("the metrics store did not answer: %s", exc.reason)
        exc = MetricsStoreUnavailable()
    elif isinstance(exc, DomainError | ProtectedError | IntegrityError):
        # (the audit middleware rolls back the request's transaction on any API error)
        if isinstance(exc, IntegrityError) and not isinstance(exc, ProtectedError):
            # a race the services' locks do not cover
            log.warning("a write conflicted with a concurrent one: %s", exc)
            detail = ("This change conflicted with a concurrent one (such as a delete) and was "
                      "not made: reload and try again.")
        else:
            detail = _protected_message(exc) if isinstance(exc, ProtectedError) else str(exc)
        return Response(_body("conflict", detail), status=status.HTTP_409_CONFLICT)

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = _CODES.get(response.status_code) or getattr(exc, "default_code", "error")
    if isinstance(exc, exceptions.ValidationError):
        errors = list(flatten_errors(exc.detail))
        fields = sorted({e["field"] for e in errors if e["field"]})
        summary = "Invalid input" + (f" in: {', '.join(fields)}." if fields else ".")
        response.data = _body(code, summary, errors)
    else:
        detail = response.data.get("detail", str(exc)) if isinstance(response.data, dict) else str(exc)
        # every 400 lists what is wrong; a body that cannot be parsed is wrong as a whole
        errors = [{"field": "", "message": str(detail)}] if response.status_code == 400 else None
        response.data = _body(code, str(detail), errors)
    return response


def _protected_message(exc: ProtectedError) -> str:
    counts = Counter(obj._meta.verbose_name_plural for obj in exc.protected_objects)
    refs = ", ".join(f"{n} {name}" for name, n in sorted(counts.items()))
    return f"Cannot delete it: {refs} still refer to it. Delete or move those first."
