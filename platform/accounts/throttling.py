"""Rate limits whose rates are read from REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"] on each use
(DRF's own classes read them once, at import), so a changed setting applies at once; among them
the limits on new API tokens and on invitations per user, applied by the REST API and the settings
page alike."""

from __future__ import annotations

from rest_framework import throttling
from rest_framework.settings import api_settings

from accounts.authentication import client_ip


class SettingsRate:
    """Mixed into a DRF throttle: the scope's rate from the settings, the client by its address
    (accounts.authentication.client_ip)."""

    def get_rate(self):
        return api_settings.DEFAULT_THROTTLE_RATES[self.scope]

    def get_ident(self, request):
        return client_ip(request)


class TokenCreateThrottle(SettingsRate, throttling.SimpleRateThrottle):
    """ASCENT_TOKEN_CREATE_RATE: new tokens per user, through the API and the settings page."""

    scope = "token-create"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}


class InviteThrottle(SettingsRate, throttling.SimpleRateThrottle):
    """ASCENT_INVITE_RATE: invitations a user sends, through the API and the settings page."""

    scope = "invite"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": request.user.pk}
