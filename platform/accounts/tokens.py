"""Token lifetimes: the one rule used by the API, the settings page and `createtoken`.

A token lives at most ASCENT_TOKEN_MAX_DAYS days (never expiring only when that is 0), and a
token created by a request authenticated with another token cannot outlive that token.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from accounts.models import ApiToken
from ascent.errors import RequestError

FIELD = "expires_in_days"


def token_expiry(days: int | None, parent: ApiToken | None = None) -> datetime | None:
    """When a new token expires (None: never), or RequestError naming expires_in_days.
    `days` None means the default, shortened to the parent token's expiry if that is sooner."""
    now = timezone.now()
    limit = parent.expires_at if parent is not None else None
    if days is None:
        expires = now + timedelta(days=settings.ASCENT_TOKEN_DEFAULT_DAYS)
        return min(expires, limit) if limit else expires
    _check_max(days)
    expires = now + timedelta(days=days) if days else None
    if limit is not None and (expires is None or expires > limit):
        latest = max(0, (limit - now).days)
        raise RequestError(FIELD, (
            f"A token cannot outlive the token that creates it, which expires "
            f"{limit:%Y-%m-%d %H:%M} UTC: ask for at most {latest} days."))
    return expires


def _check_max(days: int) -> None:
    maximum = settings.ASCENT_TOKEN_MAX_DAYS
    if days < 0:
        raise RequestError(FIELD, "Must be 0 (never expires) or a positive number of days.")
    if maximum and days == 0:
        raise RequestError(FIELD, (
            f"Tokens must expire on this server (ASCENT_TOKEN_MAX_DAYS={maximum}): "
            f"give 1 to {maximum} days."))
    if maximum and days > maximum:
        raise RequestError(FIELD, f"At most {maximum} days (ASCENT_TOKEN_MAX_DAYS): give 1 to {maximum}.")


def issue_token(user, name: str, days: int | None = None, parent: ApiToken | None = None):
    """Create a token with a checked lifetime; returns the row and the raw token (shown once)."""
    return ApiToken.issue(user, name, expires_at=token_expiry(days, parent), parent=parent)
