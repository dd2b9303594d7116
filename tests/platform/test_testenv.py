"""scripts/testenv.py: the services `make test` provides when none is configured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import os, psycopg, redis; "
    "c = psycopg.connect(os.environ['DATABASE_URL']); print(c.execute('select 41 + 1').fetchone()[0]); "
    "r = redis.Redis.from_url(os.environ['REDIS_URL']); r.set('k', 'v'); print(r.get('k').decode()); "
    "print(os.environ['DATABASE_URL']); print(os.environ['REDIS_URL'])"
)


def run_testenv(env: dict[str, str], *command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/testenv.py", "--", *command], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}


def test_it_starts_throwaway_servers_and_removes_them_afterwards():
    result = run_testenv({**base_env(), "ASCENT_TESTENV_THROWAWAY": "1"}, sys.executable, "-c", PROBE)
    assert result.returncode == 0, result.stderr
    answer, value, db_url, redis_url = result.stdout.split()
    assert (answer, value) == ("42", "v")
    assert ":5432/" not in db_url and ":6379/" not in redis_url  # not the standard ports
    assert "started a throwaway PostgreSQL" in result.stderr
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    import redis

    with pytest.raises(redis.ConnectionError):  # stopped when the command ended
        redis.Redis(port=port, socket_connect_timeout=1).ping()


def test_it_uses_the_configured_urls_as_they_are():
    env = {**base_env(), "DATABASE_URL": os.environ["DATABASE_URL"], "REDIS_URL": os.environ["REDIS_URL"]}
    result = run_testenv(env, sys.executable, "-c", PROBE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[2:] == [os.environ["DATABASE_URL"], os.environ["REDIS_URL"]]


def test_it_returns_the_commands_exit_status():
    env = {**base_env(), "DATABASE_URL": os.environ["DATABASE_URL"], "REDIS_URL": os.environ["REDIS_URL"]}
    assert run_testenv(env, sys.executable, "-c", "raise SystemExit(7)").returncode == 7


def test_it_names_the_package_to_install_when_no_server_can_be_had(tmp_path):
    # Force the throwaway path and point it at a folder without PostgreSQL's binaries.
    env = {**base_env(), "ASCENT_TESTENV_THROWAWAY": "1", "ASCENT_TESTENV_PG_BINDIR": str(tmp_path)}
    result = run_testenv(env, sys.executable, "-c", "print('never')")
    assert result.returncode != 0 and "never" not in result.stdout
    assert "apt-get install postgresql" in result.stderr
