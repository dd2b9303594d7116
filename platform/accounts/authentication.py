"""`Authorization: Bearer asc_…` authentication for the REST API, with a limit on failed tokens
per client address: beyond it an invalid token is answered 429 instead of 401. A valid token
always passes, so everyone behind one address (a NAT, or a proxy without ASCENT_BEHIND_PROXY)
keeps working while somebody there sends bad tokens; guessing gains nothing from that, since a
token holds 256 random bits."""

from __future__ import annotations

import ipaddress
import time
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone
from rest_framework import authentication, exceptions

from accounts.models import ApiToken, hash_token

# last_used_at is written at most this often per token, so reads do not turn into writes.
LAST_USED_RESOLUTION = timedelta(minutes=1)
FAILURE_KEY = "token-failures:{ip}"


def client_ip(request) -> str | None:
    """The client's address: the right-most X-Forwarded-For entry (the one our proxy added; those
    before it are whatever the client sent) when ASCENT_BEHIND_PROXY is set, else the address of
    the connection; None when neither is an IP address. The API's rate limits, the sign-in
    lockout and the audit log all use this one."""
    meta = request.META
    if settings.ASCENT_BEHIND_PROXY:
        hops = [hop.strip() for hop in meta.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        if _is_ip(hops[-1]):
            return hops[-1]
    remote = meta.get("REMOTE_ADDR", "")
    return remote if _is_ip(remote) else None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class FailedTokens:
    """Failed bearer tokens per client address, counted in a fixed window in the cache."""

    @staticmethod
    def wait(ip: str) -> float | None:
        """Seconds until the address may try again, or None while under the limit."""
        key = FAILURE_KEY.format(ip=ip)
        found = cache.get_many([key, f"{key}:since"])
        if found.get(key, 0) < settings.ASCENT_TOKEN_FAILURE_LIMIT:
            return None
        since = found.get(f"{key}:since") or time.time()
        return max(1.0, settings.ASCENT_TOKEN_FAILURE_WINDOW_S - (time.time() - since))

    @staticmethod
    def record(ip: str) -> None:
        key, window = FAILURE_KEY.format(ip=ip), settings.ASCENT_TOKEN_FAILURE_WINDOW_S
        cache.add(f"{key}:since", time.time(), window)
        cache.add(key, 0, window)
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, window)


class TooManyFailedTokens(exceptions.Throttled):
    default_detail = "Too many invalid tokens from your address."
    extra_detail_singular = extra_detail_plural = "Try again in {wait} seconds."


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        try:
            return self._check(header)
        except exceptions.AuthenticationFailed:
            ip = client_ip(request) or "unknown"
            wait = FailedTokens.wait(ip)
            if wait is not None:
                raise TooManyFailedTokens(wait=wait) from None
            FailedTokens.record(ip)
            raise

    def _check(self, header):
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "Malformed Authorization header: expected 'Bearer <token>'."
            )
        try:
            raw = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("The token contains invalid characters.") from None
        token = (
            ApiToken.objects.select_related("user").filter(key_hash=hash_token(raw)).first()
        )
        if token is None or not token.is_active:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("The token's user is inactive.")
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request):
        return self.keyword
