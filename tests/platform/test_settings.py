"""Settings come from the environment; a malformed value stops start-up naming the variable."""

from __future__ import annotations

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


def _django_check(settings_module: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG")}
    clean.update(DJANGO_SETTINGS_MODULE=settings_module, ASCENT_VAR_DIR=str(tmp_path), **env)
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=clean,
                          capture_output=True, text=True, timeout=120)


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
    good = _django_check("ascent.settings_production", tmp_path, SECRET_KEY="k" * 50,
                         ALLOWED_HOSTS="ascent.example")
    assert good.returncode == 0, good.stderr


def test_the_cache_is_the_configured_redis(db):
    import redis
    from django.core.cache import cache, caches

    assert type(caches["default"]).__name__ == "RedisCache"
    cache.set("ascent-test-key", {"n": 1}, timeout=5)
    assert cache.get("ascent-test-key") == {"n": 1}
    assert redis.Redis.from_url(os.environ["REDIS_URL"]).exists(":1:ascent-test-key") == 1
