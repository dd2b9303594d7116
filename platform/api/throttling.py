"""API rate limits: per token or signed-in user, per address for anonymous requests, and token
creation per user. Rates are read from REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] on each use, so
a changed setting applies at once (DRF's own classes read them once, at import)."""

from __future__ import annotations

from rest_framework import throttling
from rest_framework.settings import api_settings

from accounts.authentication import client_ip
from accounts.models import ApiToken


class _SettingsRate:
    def get_rate(self):
        return api_settings.DEFAULT_THROTTLE_RATES[self.scope]

    def get_ident(self, request):
        return client_ip(request)


class UserRateThrottle(_SettingsRate, throttling.SimpleRateThrottle):
    """ASCENT_API_RATE_USER per token (a request with a bearer token) or per signed-in user."""

    scope = "user"

    def get_cache_key(self, request, view):
        if not (request.user and request.user.is_authenticated):
            return None
        auth = request.auth
        ident = f"token-{auth.pk}" if isinstance(auth, ApiToken) else f"user-{request.user.pk}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


class AnonRateThrottle(_SettingsRate, throttling.AnonRateThrottle):
    """ASCENT_API_RATE_ANON per client address for requests without credentials."""


class TokenCreateThrottle(_SettingsRate, throttling.SimpleRateThrottle):
    """ASCENT_TOKEN_CREATE_RATE: new tokens per user, through the API and the settings page."""

    scope = "token-create"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}
