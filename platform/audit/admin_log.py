"""Django admin writes, mirrored from the LogEntry rows the admin wrote during the request.

Bulk actions that write no LogEntry (such as draining nodes from the node list) are recorded
once per selected object when the admin answers with a redirect (the action was done).
"""

from __future__ import annotations

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry

from audit import services
from audit.objects import describe

VERBS = {ADDITION: "create", CHANGE: "update", DELETION: "delete"}
# Admin models by their audit object type (the rest use the model's name).
TYPES = {"accounts.apitoken": "token", "accounts.membership": "member"}
CHANGE_CHARS = 500


def capture(request, response, match, started) -> None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return
    entries = LogEntry.objects.filter(user_id=user.pk, action_time__gte=started)
    entries = list(entries.select_related("content_type").order_by("id"))
    for entry in entries:
        _mirror(request, response, entry)
    if not entries and response.status_code in (301, 302, 303) and request.POST.get("action"):
        _record_bulk_action(request, response, match)


def _type_of(app_label: str, model: str) -> str:
    return TYPES.get(f"{app_label}.{model}", model)


def _mirror(request, response, entry: LogEntry) -> None:
    object_type = _type_of(entry.content_type.app_label, entry.content_type.model)
    described = describe(object_type, entry.object_id, {})
    services.record(
        strict=True,
        action=f"{object_type}.{VERBS.get(entry.action_flag, 'change')}", object_type=object_type,
        object_id=entry.object_id, object_repr=entry.object_repr,
        project_id=described[1] if described else None,
        details={"via": "admin", "change": entry.get_change_message()[:CHANGE_CHARS]},
        status=response.status_code, **_who(request), **services.origin(request),
    )


def _record_bulk_action(request, response, match) -> None:
    app_label, _, rest = match.url_name.partition("_")
    object_type = _type_of(app_label, rest.removesuffix("_changelist"))
    action = request.POST["action"][:32]
    for object_id in request.POST.getlist("_selected_action"):
        described = describe(object_type, object_id, {})
        services.record(
            strict=True,
            action=f"{object_type}.{action}", object_type=object_type, object_id=object_id,
            object_repr=described[0] if described else "", project_id=described[1] if described else None,
            details={"via": "admin"}, status=response.status_code, **_who(request),
            **services.origin(request),
        )


def _who(request) -> dict:
    return services.actor(request.user)
