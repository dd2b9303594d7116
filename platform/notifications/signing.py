"""Signatures of webhook requests, the retry schedule, and which webhook URLs may be called.

Pure functions (the clock and the resolver are passed in), so receivers can check them the same
way. A request carries `X-Ascent-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>` of
`"<t>.<body>"` under the webhook's secret; `verify` accepts it within `tolerance_s` of `now`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import socket
import time
from collections.abc import Callable
from urllib.parse import urlsplit

MAX_ATTEMPTS = 6  # tries of one delivery before it is marked failed
FIRST_RETRY_S = 10.0  # then x3 each time: 10 s, 30 s, 90 s, 270 s, 810 s


def signature(secret: str, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def verify(secret: str, header: str, body: bytes, *, tolerance_s: float = 300.0,
           now: float | None = None) -> bool:
    """Whether `header` is a valid signature of `body`, made within `tolerance_s` of now."""
    try:
        parts = dict(part.split("=", 1) for part in header.split(","))
        timestamp = int(parts["t"])
    except (KeyError, ValueError):
        return False
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = signature(secret, timestamp, body).split(",v1=")[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


def retry_delay_s(attempts: int) -> float:
    """Seconds before the next try after `attempts` failed ones (>= 1)."""
    return FIRST_RETRY_S * 3 ** (attempts - 1)


Resolver = Callable[[str, int], list[str]]


def resolve(host: str, port: int) -> list[str]:
    return sorted({info[4][0] for info in socket.getaddrinfo(host, port,
                                                             type=socket.SOCK_STREAM)})


def url_problem(url: str, *, allow_local: bool = False, resolver: Resolver = resolve) -> str | None:
    """Why `url` may not be a webhook, or None: http or https, a host, no credentials, and
    (unless `allow_local`) no loopback, link-local, unspecified or multicast address for the
    host, checked on what it resolves to (also before each delivery)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return "Use an http:// or https:// URL."
    if not parts.hostname:
        return "The URL has no host."
    if parts.username or parts.password:
        return "Leave credentials out of the URL: each request is signed with the secret."
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "The URL's port is not a number from 1 to 65535."
    try:
        addresses = resolver(parts.hostname, port)
    except (OSError, UnicodeError) as exc:
        return f"Cannot resolve {parts.hostname}: {exc}."
    if not addresses:
        return f"{parts.hostname} resolves to no address."
    if allow_local:
        return None
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        mapped = getattr(ip, "ipv4_mapped", None)
        ip = mapped or ip
        if ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast:
            return (f"{parts.hostname} resolves to {address}, a loopback, link-local or "
                    "multicast address: only a platform administrator may allow one "
                    "(allow_local).")
    return None
