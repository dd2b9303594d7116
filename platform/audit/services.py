"""Recording audit entries (never failing the request that caused them) and purging old ones."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from accounts.authentication import client_ip
from audit.models import AuditEntry

log = logging.getLogger(__name__)

USER_AGENT_CHARS = 256
PATH_CHARS = 512


def origin(request) -> dict:
    """Where a request came from: client IP, user agent (truncated), method and path."""
    if request is None:
        return {}
    return {
        "ip": client_ip(request),
        "user_agent": request.META.get("HTTP_USER_AGENT", "")[:USER_AGENT_CHARS],
        "method": (request.method or "")[:8],
        "path": (request.path or "")[:PATH_CHARS],
    }


def actor(user, auth=None) -> dict:
    """The actor fields: the user, their name, and 'session' or 'token <prefix>'."""
    if user is None or not getattr(user, "is_authenticated", False):
        return {}
    prefix = getattr(auth, "prefix", "")
    return {"actor": user, "actor_name": user.get_username()[:150],
            "auth_method": f"token {prefix}" if prefix else "session"}


def record(*, strict: bool = False, **fields) -> AuditEntry | None:
    """Store one entry. `strict` (a write's entry, in the write's transaction: audit.middleware)
    raises when it cannot be stored, so the write is not kept either; otherwise (sign-ins, the
    worker's events) the error is logged and swallowed."""
    if strict:
        return AuditEntry.objects.create(**_checked(fields))
    try:
        with transaction.atomic():
            return AuditEntry.objects.create(**_checked(fields))
    except Exception:
        log.exception("Could not record the audit entry %s", fields.get("action"))
        return None


def _checked(fields: dict) -> dict:
    """Drop references to rows that no longer exist (a deleted project), truncate strings."""
    from accounts.models import Project

    project = fields.get("project_id")
    if project is not None and not Project.objects.filter(pk=project).exists():
        fields["project_id"] = None
    user = fields.get("actor")
    if user is not None and not get_user_model().objects.filter(pk=user.pk).exists():
        fields["actor"] = None
    for name, limit in (("object_id", 64), ("object_repr", 200), ("action", 64)):
        fields[name] = str(fields.get(name) or "")[:limit]
    return fields


def purge(older_than: datetime) -> int:
    """Delete entries created before `older_than`; returns how many."""
    deleted, _ = AuditEntry.objects.filter(created_at__lt=older_than).delete()
    return deleted


def purge_expired(days: int | None = None) -> int:
    """Apply the retention (ASCENT_AUDIT_RETENTION_DAYS unless given; 0 keeps everything)."""
    days = settings.ASCENT_AUDIT_RETENTION_DAYS if days is None else days
    if days <= 0:
        return 0
    return purge(timezone.now() - timedelta(days=days))
