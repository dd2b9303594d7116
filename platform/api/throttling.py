"""API rate limits: per token or signed-in user, and per address for anonymous requests (token
creation per user is accounts.throttling.TokenCreateThrottle, shared with the settings page).
Rates are read from REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] on each use, so a changed setting
applies at once (DRF's own classes read them once, at import)."""

from __future__ import annotations

from rest_framework import throttling

from accounts.models import ApiToken
from accounts.throttling import SettingsRate


class UserRateThrottle(SettingsRate, throttling.SimpleRateThrottle):
    """ASCENT_API_RATE_USER per token (a request with a bearer token) or per signed-in user."""

    scope = "user"

    def get_cache_key(self, request, view):
        if not (request.user and request.user.is_authenticated):
            return None
        auth = request.auth
        ident = f"token-{auth.pk}" if isinstance(auth, ApiToken) else f"user-{request.user.pk}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


class AnonRateThrottle(SettingsRate, throttling.AnonRateThrottle):
    """ASCENT_API_RATE_ANON per client address for requests without credentials."""

