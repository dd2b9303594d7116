"""Typed readers for settings taken from the environment.

Each reader returns the default when the variable is unset or empty and raises
ImproperlyConfigured naming the variable when its value is malformed, so a typo
stops start-up instead of silently changing behaviour.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _raw(name: str, environ_: Mapping[str, str] | None) -> str | None:
    value = (os.environ if environ_ is None else environ_).get(name)
    return None if value is None or value.strip() == "" else value.strip()


def _bad(name: str, value: str, expected: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{name}={value!r} is not valid: expected {expected}.")


def env_str(name: str, default: str, environ_: Mapping[str, str] | None = None) -> str:
    value = _raw(name, environ_)
    return default if value is None else value


def env_bool(name: str, default: bool, environ_: Mapping[str, str] | None = None) -> bool:
    value = _raw(name, environ_)
    if value is None:
        return default
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise _bad(name, value, "one of 1/0, true/false, yes/no, on/off")


def env_int(
    name: str, default: int, environ_: Mapping[str, str] | None = None, *, minimum: int | None = None
) -> int:
    value = _raw(name, environ_)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise _bad(name, value, "a whole number") from None
    if minimum is not None and number < minimum:
        raise _bad(name, value, f"a whole number >= {minimum}")
    return number


def env_list(name: str, default: list[str], environ_: Mapping[str, str] | None = None) -> list[str]:
    value = _raw(name, environ_)
    if value is None:
        return list(default)
    items = [item.strip() for item in value.split(",")]
    if any(item == "" for item in items):
        raise _bad(name, value, "a comma-separated list without empty items")
    return items


def env_url(
    name: str, default: str, environ_: Mapping[str, str] | None = None, *, schemes: tuple[str, ...]
) -> str:
    value = _raw(name, environ_) or default
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        raise _bad(name, value, f"a URL whose scheme is one of {', '.join(schemes)}")
    if not parts.scheme.startswith(("sqlite", "sqla+sqlite")) and not parts.hostname:
        raise _bad(name, value, "a URL with a host, such as scheme://host:port/...")
    try:
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise _bad(name, value, "a URL with a numeric port") from None
    return value


def env_database(name: str, default: str, environ_: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Django DATABASES entry from a URL such as postgres://user:pass@host:5432/db."""
    url = env_url(name, default, environ_, schemes=("postgres", "postgresql", "pgsql", "sqlite"))
    try:
        config = environ.Env.db_url_config(url)
    except Exception as exc:  # django-environ raises several types for bad URLs
        raise _bad(name, url, f"a database URL ({exc})") from None
    if config["ENGINE"].endswith("sqlite3") and config["NAME"] in ("", ":memory:"):
        raise _bad(name, url, "sqlite:////absolute/path.sqlite3 (a file, so every process sees it)")
    return config


_RATE_PERIODS = ("s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day")


def env_rate(name: str, default: str, environ_: Mapping[str, str] | None = None) -> str:
    """A request rate such as "60/min": a whole number, a slash and s, min, hour or day."""
    value = _raw(name, environ_) or default
    count, _, period = value.partition("/")
    if not count.isdigit() or int(count) < 1 or period not in _RATE_PERIODS:
        raise _bad(name, value, "a rate such as 60/min (a positive number / s, min, hour or day)")
    return value
