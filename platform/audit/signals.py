"""Sign-in events (success, failure, sign-out) and the rows a request creates."""

from __future__ import annotations

import contextvars

from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import post_save

from audit import services

USERNAME_CHARS = 150
# (model, pk) of every row inserted while the current request runs (set by the middleware).
created_rows: contextvars.ContextVar[list | None] = contextvars.ContextVar("created_rows", default=None)


def connect() -> None:
    user_logged_in.connect(logged_in, dispatch_uid="audit.logged_in")
    user_logged_out.connect(logged_out, dispatch_uid="audit.logged_out")
    user_login_failed.connect(login_failed, dispatch_uid="audit.login_failed")
    post_save.connect(row_saved, dispatch_uid="audit.row_saved")


def logged_in(sender, request, user, **kwargs) -> None:
    _auth_event("auth.login", request, user)


def logged_out(sender, request, user, **kwargs) -> None:
    _auth_event("auth.logout", request, user)


def _auth_event(action: str, request, user) -> None:
    services.record(action=action, object_type="user" if user else "", object_id=getattr(user, "pk", ""),
                    object_repr=user.get_username() if user else "", **services.actor(user),
                    **services.origin(request))


def login_failed(sender, credentials, request=None, **kwargs) -> None:
    """Only the username that was tried is kept: never the password."""
    username = str(credentials.get("username") or "")[:USERNAME_CHARS]
    services.record(action="auth.login_failed", actor_name=username, object_type="user",
                    object_repr=username, details={"username": username}, status=None,
                    **services.origin(request))


def row_saved(sender, instance, created, raw=False, **kwargs) -> None:
    """Note rows inserted during an audited request, so a create can name what it made."""
    if not created or raw:
        return
    rows = created_rows.get()
    if rows is not None:
        rows.append((sender, instance.pk))
