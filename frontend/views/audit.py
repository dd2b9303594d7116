"""The audit log page for platform administrators (staff): entries newest first, filtered."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import render
from django.utils.dateparse import parse_date
from django.utils.http import urlencode

from audit.models import AuditEntry
from experiments.queries import parse_id

PAGE_SIZE = 50
FILTERS = ("actor", "action", "object_type", "object_id", "project", "created_after", "created_before")


def filtered_entries(params):
    """Entries matching the page's filters: exact actor, object and project; an action or its
    kind (`run.`); a date range (`created_before` is exclusive)."""
    entries = AuditEntry.objects.select_related("project")
    exact = {"actor": "actor_name", "object_type": "object_type", "object_id": "object_id"}
    for name, field in exact.items():
        if params.get(name, "").strip():
            entries = entries.filter(**{field: params[name].strip()})
    action = params.get("action", "").strip()
    if action:
        kind = action.endswith(".")
        entries = entries.filter(action__startswith=action) if kind else entries.filter(action=action)
    project = parse_id(params.get("project"))
    if project:
        entries = entries.filter(project_id=project)
    for name, lookup in (("created_after", "gte"), ("created_before", "lt")):
        day = _date(params.get(name, ""))
        if day:
            entries = entries.filter(**{f"created_at__date__{lookup}": day})
    return entries


def _date(text: str):
    try:
        return parse_date(text.strip())
    except (ValueError, ValidationError):
        return None


@login_required
def audit_log(request):
    if not request.user.is_staff:
        raise Http404("The audit log is shown to platform administrators (staff) only.")
    page = Paginator(filtered_entries(request.GET), PAGE_SIZE).get_page(request.GET.get("page"))
    chosen = {name: request.GET.get(name, "") for name in FILTERS}
    for entry in page.object_list:
        entry.details_text = "; ".join(f"{key}: {value}" for key, value in entry.details.items())
    return render(request, "frontend/audit.html", {
        "page": page, "chosen": chosen, "filtered": any(chosen.values()),
        "actions": AuditEntry.objects.order_by("action").values_list("action", flat=True).distinct(),
        "query": urlencode({name: value for name, value in chosen.items() if value}),
    })
