"""Records every successful write through the REST API, the web UI's forms and the admin.

One place per channel instead of a call in every view: after the response, the resolver's view
name (e.g. `run-cancel`) and URL keywords name the action and the object (audit.routes); the
actor is read from the request after the view, when DRF has authenticated bearer tokens.
Failed writes (status 400 and above, or a form page that reported an error) record nothing.

A write and its audit entry are one transaction: the request runs inside it and the entry is
written before it commits, so a write is never kept without its entry. If the entry cannot be
written (a 503 says so), or the request failed (a 5xx, or any API error), everything it did is
rolled back; a write that conflicts with a concurrent one when it commits (a row another request
deleted) is a 409, with nothing changed.
"""

from __future__ import annotations

import logging

from django.contrib import messages
from django.db import IntegrityError, OperationalError, transaction
from django.http import HttpResponse, JsonResponse
from django.utils import timezone

from audit import admin_log, services
from audit.objects import MODELS, describe
from audit.routes import IGNORED, route_for
from audit.signals import created_rows

log = logging.getLogger(__name__)

SAFE_METHODS = {"GET", "HEAD", "OPTIONS", "TRACE"}
KEPT_CHARS = 200


class AuditMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method in SAFE_METHODS:
            return self.get_response(request)
        try:
            with transaction.atomic():
                return self._write(request)
        except (IntegrityError, OperationalError) as exc:  # raised by the commit itself
            log.warning("%s %s conflicted with a concurrent change: %s", request.method,
                        request.path, exc)
            return _failed(request, 409, "conflict", "This change conflicted with a concurrent "
                           "one (such as a delete) and was not made: reload and try again.")

    def _write(self, request):
        started, rows = timezone.now(), []
        token = created_rows.set(rows)
        try:
            response = self.get_response(request)
        finally:
            created_rows.reset(token)
        if response.status_code >= 500 or (
                response.status_code >= 400 and request.path.startswith("/api/")):
            # A failed or refused API request keeps nothing it half did. (A refused sign-in
            # keeps its failure: django-axes counts them in the database.)
            transaction.set_rollback(True)
            return response
        try:
            capture(request, response, rows, started)
        except Exception:
            log.exception("Could not audit %s %s: nothing of it is kept", request.method,
                          request.path)
            transaction.set_rollback(True)
            return _failed(request, 503, "audit_unavailable", "The change could not be "
                           "recorded in the audit log, so it was not made: try again shortly.")
        return response

    def process_view(self, request, view_func, view_args, view_kwargs):
        """Describe the object before the view runs, for writes that delete it."""
        if request.method in SAFE_METHODS:
            return None
        try:
            request.audit_before = _before(request)
        except Exception:
            log.exception("Could not describe the object of %s %s", request.method, request.path)
        return None


def _failed(request, status: int, code: str, detail: str) -> HttpResponse:
    """A refused write: JSON in the API's error shape under /api/, plain text elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": code, "detail": detail}, status=status)
    return HttpResponse(detail, status=status, content_type="text/plain; charset=utf-8")


def _before(request):
    match = request.resolver_match
    route = route_for(match.view_name) if match else None
    if route is None or route.create or route.from_body:
        return None
    return describe(route.object_type, match.kwargs.get(route.key), match.kwargs)


def capture(request, response, rows: list, started) -> None:
    match = request.resolver_match
    if match is None or response.status_code >= 400:
        return
    if request.path.startswith("/admin/"):
        admin_log.capture(request, response, match, started)
    elif request.path.startswith("/api/v1/") or match.namespace == "frontend":
        if match.view_name not in IGNORED and not _form_reported_error(request):
            record_write(request, response, match, rows)


def _form_reported_error(request) -> bool:
    """A web UI form answers a refusal with a redirect and an error message."""
    queued = getattr(getattr(request, "_messages", None), "_queued_messages", [])
    return any(message.level >= messages.ERROR for message in queued)


def record_write(request, response, match, rows: list) -> None:
    body = _body(request, response)
    route = route_for(match.view_name)
    verb = route.verb(request.method, match.kwargs, body) if route else None
    if verb is None:
        _record_generic(request, response, match)
        return
    made = _made(route, rows)
    if route.create and not made:  # nothing was made: a form shown again, a repeated submit
        return
    verb = route.by_status.get(response.status_code) or next((v for v in made.values() if v), verb)
    object_id = _object_id(route, match.kwargs, body, response, made)
    described = describe(route.object_type, object_id, match.kwargs) or getattr(request, "audit_before", None)
    object_repr, project_id = described or ("", None)
    services.record(
        strict=True,
        action=f"{route.object_type}.{verb}", object_type=route.object_type, object_id=object_id,
        object_repr=object_repr, project_id=project_id, details=_details(route, verb, match, body),
        status=response.status_code, **_who(request), **services.origin(request),
    )


def _made(route, rows: list) -> dict[int, str]:
    """Rows of the kinds this create makes: pk -> the verb their kind stands for ('' : the route's)."""
    kinds = {MODELS.get(kind): verb for kind, verb in route.made_kinds().items()}
    return {pk: kinds[model] for model, pk in rows if model in kinds and model is not None}


def _object_id(route, kwargs: dict, body, response, made: dict):
    if route.from_body:
        return _value(body, route.key)
    if route.create:
        data = getattr(response, "data", None)
        return data["id"] if isinstance(data, dict) and "id" in data else next(iter(made))
    return kwargs.get(route.key)


def _details(route, verb: str, match, body) -> dict:
    """Kept field values (never a secret), the source of a copy, the names of changed fields."""
    details = {name: str(_value(body, name))[:KEPT_CHARS] for name in route.keep
               if _value(body, name) not in (None, "")}
    if route.create and route.object_type == "run" and "pk" in match.kwargs:
        details["from_run"] = int(match.kwargs["pk"])
    if verb == "update" and hasattr(body, "keys"):
        details["fields"] = sorted(str(key) for key in body.keys() if key != "csrfmiddlewaretoken")
    return details


def _record_generic(request, response, match) -> None:
    """A write no route describes is recorded anyway, named by its view."""
    kwargs = {key: str(value)[:KEPT_CHARS] for key, value in match.kwargs.items()}
    services.record(
        strict=True,
        action=f"unmapped.{request.method.lower()}", object_id=kwargs.get("pk", ""),
        details={"view": match.view_name, "kwargs": kwargs}, status=response.status_code,
        **_who(request), **services.origin(request),
    )


def _who(request) -> dict:
    return services.actor(getattr(request, "user", None), getattr(request, "auth", None))


def _body(request, response):
    """The parsed request body: DRF's (JSON or form) when the view was DRF's, else the form."""
    drf_request = (getattr(response, "renderer_context", None) or {}).get("request")
    if drf_request is not None:
        try:
            return drf_request.data
        except Exception:
            return {}
    try:
        return request.POST
    except Exception:
        return {}


def _value(body, name: str):
    try:
        return body.get(name)
    except AttributeError:
        return None
