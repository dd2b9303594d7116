"""Settings come from the environment; a malformed value stops start-up naming the variable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from ascent.envconf import env_bool, env_database, env_int, env_list, env_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("reader", "name", "value", "expected"),
    [
        (lambda e: env_bool("DEBUG", True, e), "DEBUG", "maybe", "DEBUG='maybe' is not valid"),
        (lambda e: env_int("PORTS", 1, e), "PORTS", "1.5", "a whole number"),
        (lambda e: env_int("N", 1, e, minimum=2), "N", "1", ">= 2"),
        (lambda e: env_list("ALLOWED_HOSTS", [], e), "ALLOWED_HOSTS", "a,,b", "without empty items"),
        (lambda e: env_url("CELERY_BROKER_URL", "", e, schemes=("redis",)), "CELERY_BROKER_URL",
         "kafka://x", "scheme is one of redis"),
        (lambda e: env_url("REDIS_URL", "", e, schemes=("redis",)), "REDIS_URL", "redis://h:port/0",
         "numeric port"),
        (lambda e: env_database("DATABASE_URL", "", e), "DATABASE_URL", "mysql//nope", "DATABASE_URL="),
        (lambda e: env_database("DATABASE_URL", "", e), "DATABASE_URL", "sqlite://", "a file"),
    ],
)
def test_it_names_the_variable_of_a_malformed_value(reader, name, value, expected):
    with pytest.raises(ImproperlyConfigured, match=name) as info:
        reader({name: value})
    assert expected in str(info.value)


def test_it_reads_typed_values_and_defaults():
    env = {"DEBUG": "off", "N": "7", "HOSTS": "a.example, b.example"}
    assert env_bool("DEBUG", True, env) is False
    assert env_bool("UNSET", True, env) is True
    assert env_int("N", 1, env) == 7
    assert env_list("HOSTS", [], env) == ["a.example", "b.example"]
    db = env_database("DATABASE_URL", "", {"DATABASE_URL": "postgres://u:p@db:5433/ascent"})
    assert (db["ENGINE"], db["HOST"], db["PORT"], db["NAME"]) == (
        "django.db.backends.postgresql", "db", 5433, "ascent")


def _django(args: list[str], settings_module: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    unset = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "ASCENT_BEHIND_PROXY")
    clean = {k: v for k, v in os.environ.items() if k not in unset}
    clean.update(DJANGO_SETTINGS_MODULE=settings_module, ASCENT_VAR_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=120)


def _django_check(settings_module: str, tmp_path: Path, *options: str, **env: str) -> subprocess.CompletedProcess:
    return _django(["manage.py", "check", *options], settings_module, tmp_path, **env)


def test_start_up_stops_on_a_malformed_variable(tmp_path):
    result = _django_check("ascent.settings", tmp_path, DEBUG="maybe")
    assert result.returncode != 0
    assert "ImproperlyConfigured: DEBUG='maybe' is not valid" in result.stderr


def test_the_embedded_defaults_start(tmp_path):
    result = _django_check("ascent.settings", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_the_default_secret_key(tmp_path):
    result = _django_check("ascent.settings_production", tmp_path)
    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr
    good = _django_check("ascent.settings_production", tmp_path, SECRET_KEY=GOOD_KEY,
                         ALLOWED_HOSTS="ascent.example")
    assert good.returncode == 0, good.stderr


# --- production: HTTPS, HSTS, the secret key ------------------------------------------------

GOOD_KEY = "tV3q-8xYp2Lr0sKd7NwZ_eHj5uBc1mFa9gQi4oRy6zTn3vXk0LpS"  # 52 characters, random

# Two requests through Django's test client in a process with the production settings: one to
# /healthz claiming HTTPS with X-Forwarded-Proto, one to a page over plain HTTP without it.
PROBE = """
import json, sys
sys.path[:0] = ["platform", "."]
import django
django.setup()
from django.test import Client

def probe(path, **headers):
    response = Client(headers=headers).get(path)
    return {"status": response.status_code, "secure": response.wsgi_request.is_secure(),
            "hsts": response.get("Strict-Transport-Security"), "location": response.get("Location")}

print(json.dumps({"forwarded": probe("/healthz", x_forwarded_proto="https"), "plain": probe("/runs/")}))
"""


def _probe(tmp_path: Path, **env: str) -> dict:
    result = _django(["-c", PROBE], "ascent.settings_production", tmp_path, SECRET_KEY=GOOD_KEY,
                     ALLOWED_HOSTS="testserver", **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_it_ignores_x_forwarded_proto_when_not_behind_a_proxy(tmp_path):
    seen = _probe(tmp_path)
    assert seen["forwarded"] == {"status": 200, "secure": False, "hsts": None, "location": None}
    assert seen["plain"]["status"] == 302  # to sign-in: no redirect to HTTPS by default
    assert seen["plain"]["location"].startswith("/sign-in/")


def test_it_trusts_x_forwarded_proto_behind_a_proxy_and_sends_hsts(tmp_path):
    seen = _probe(tmp_path, ASCENT_BEHIND_PROXY="true")
    assert seen["forwarded"]["secure"] is True
    assert seen["forwarded"]["hsts"] == "max-age=31536000; includeSubDomains"
    assert seen["plain"]["status"] == 301  # plain HTTP is sent to HTTPS
    assert seen["plain"]["location"] == "https://testserver/runs/"


def test_it_sends_hsts_as_configured(tmp_path):
    seen = _probe(tmp_path, ASCENT_BEHIND_PROXY="true", SECURE_HSTS_SECONDS="600",
                  SECURE_HSTS_INCLUDE_SUBDOMAINS="false", SECURE_SSL_REDIRECT="false")
    assert seen["forwarded"]["hsts"] == "max-age=600"
    assert seen["plain"]["status"] == 302


@pytest.mark.parametrize(("key", "problem"), [
    (GOOD_KEY[:49], "it has 49 characters"),
    ("ab" * 30, "fewer than 5 different characters"),
])
def test_production_refuses_a_weak_secret_key_saying_how_to_make_one(tmp_path, key, problem):
    result = _django_check("ascent.settings_production", tmp_path, SECRET_KEY=key,
                           ALLOWED_HOSTS="ascent.example")
    assert result.returncode != 0
    assert "SECRET_KEY must be set to a random value of at least 50 characters" in result.stderr
    assert problem in result.stderr
    assert "secrets.token_urlsafe(50)" in result.stderr


def test_the_deploy_check_is_clean_behind_a_proxy(tmp_path):
    result = _django_check("ascent.settings_production", tmp_path, "--deploy", "--fail-level",
                           "WARNING", SECRET_KEY=GOOD_KEY, ALLOWED_HOSTS="ascent.example",
                           ASCENT_BEHIND_PROXY="true")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_the_cache_is_the_configured_redis(db):
    import redis
    from django.core.cache import cache, caches

    assert type(caches["default"]).__name__ == "RedisCache"
    cache.set("ascent-test-key", {"n": 1}, timeout=5)
    assert cache.get("ascent-test-key") == {"n": 1}
    assert redis.Redis.from_url(os.environ["REDIS_URL"]).exists(":1:ascent-test-key") == 1
