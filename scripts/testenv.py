#!/usr/bin/env python3
"""Provide PostgreSQL and Redis for the test suite, then run a command with them.

    python scripts/testenv.py -- python -m pytest

For each service, in order:
  1. the one named by DATABASE_URL / REDIS_URL, used as it is;
  2. the one on its standard local port (PostgreSQL 127.0.0.1:5432, Redis 127.0.0.1:6379): for
     PostgreSQL the role and database `ascent` are created when missing;
  3. a throwaway server started from the installed binaries in a temporary folder, stopped and
     deleted when the command ends.
Where none of these is possible it says which packages to install and exits with status 1.
The command's exit status is returned.

ASCENT_TESTENV_THROWAWAY=1 skips step 2 (a configured URL is still used), and ASCENT_TESTENV_PG_BINDIR names the folder of
initdb and pg_ctl (default: PATH, then /usr/lib/postgresql/<newest>/bin); the tests use both.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, closing
from pathlib import Path

PG_ROLE = PG_DB = "ascent"
PG_SUPERUSERS = ("postgres", "root")


def log(message: str) -> None:
    print(f"[testenv] {message}", file=sys.stderr, flush=True)


def port_open(host: str, port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise SystemExit(f"[testenv] {what} did not come up within {timeout:.0f}s")


# --- PostgreSQL -----------------------------------------------------------------------------

def ensure_role_and_db(host: str, port: int, superuser: str) -> None:
    import psycopg

    with psycopg.connect(host=host, port=port, user=superuser, dbname="postgres",
                         autocommit=True, connect_timeout=5) as conn:
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname=%s", (PG_ROLE,)).fetchone():
            conn.execute(f"CREATE ROLE {PG_ROLE} LOGIN CREATEDB PASSWORD '{PG_ROLE}'")
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname=%s", (PG_DB,)).fetchone():
            conn.execute(f"CREATE DATABASE {PG_DB} OWNER {PG_ROLE}")


def local_postgres() -> str | None:
    if not port_open("127.0.0.1", 5432):
        return None
    for superuser in PG_SUPERUSERS:
        try:
            ensure_role_and_db("127.0.0.1", 5432, superuser)
        except Exception as exc:  # wrong role, password required, ...
            log(f"PostgreSQL on 5432 as {superuser}: {exc}".strip())
            continue
        return f"postgres://{PG_ROLE}:{PG_ROLE}@127.0.0.1:5432/{PG_DB}"
    return None


def pg_binaries() -> Path | None:
    override = os.environ.get("ASCENT_TESTENV_PG_BINDIR")  # where initdb and pg_ctl live
    if override:
        return Path(override) if (Path(override) / "initdb").exists() else None
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(versions[-1]).parent if versions else None


def as_server_user(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its binaries as the `postgres` user then."""
    if os.geteuid() != 0:
        return cmd
    return ["runuser", "-u", "postgres", "--", *cmd]


def throwaway_postgres(stack: ExitStack) -> str:
    bindir = pg_binaries()
    if bindir is None:
        raise SystemExit(
            "[testenv] No PostgreSQL answers on 127.0.0.1:5432 and no server binaries were found.\n"
            "Install them (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL."
        )
    tmp = Path(tempfile.mkdtemp(prefix="ascent-pg-"))
    stack.callback(shutil.rmtree, tmp, ignore_errors=True)
    if os.geteuid() == 0:
        shutil.chown(tmp, "postgres", "postgres")
    data, port = tmp / "data", free_port()
    subprocess.run(as_server_user([str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                                   "--auth=trust", "-E", "UTF8"]),
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(tmp / "log"),
                                   "-o", f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1 -c fsync=off",
                                   "-w", "start"]),
                   check=True, stdout=subprocess.DEVNULL)
    stack.callback(subprocess.run, as_server_user([str(bindir / "pg_ctl"), "-D", str(data),
                                                   "-m", "immediate", "stop"]),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ensure_role_and_db("127.0.0.1", port, "postgres")
    log(f"started a throwaway PostgreSQL on 127.0.0.1:{port} in {tmp}")
    return f"postgres://{PG_ROLE}:{PG_ROLE}@127.0.0.1:{port}/{PG_DB}"


# --- Redis ----------------------------------------------------------------------------------

def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=2).ping())
    except redis.RedisError:
        return False


def throwaway_redis(stack: ExitStack) -> str:
    server = shutil.which("redis-server")
    if server is None:
        raise SystemExit(
            "[testenv] No Redis answers on 127.0.0.1:6379 and redis-server was not found.\n"
            "Install it (Debian/Ubuntu: apt-get install redis-server) or set REDIS_URL."
        )
    tmp = Path(tempfile.mkdtemp(prefix="ascent-redis-"))
    stack.callback(shutil.rmtree, tmp, ignore_errors=True)
    port = free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL)
    stack.callback(proc.wait, timeout=10)
    stack.callback(proc.terminate)
    url = f"redis://127.0.0.1:{port}/0"
    wait_until(lambda: redis_answers(url), "the throwaway Redis")
    log(f"started a throwaway Redis on 127.0.0.1:{port}")
    return url


# --- main -----------------------------------------------------------------------------------

def provide(stack: ExitStack, env: dict[str, str]) -> None:
    force = env.get("ASCENT_TESTENV_THROWAWAY", "") == "1"  # to test the fallback itself
    if not env.get("DATABASE_URL"):
        env["DATABASE_URL"] = (None if force else local_postgres()) or throwaway_postgres(stack)
    if not env.get("REDIS_URL"):
        local = "redis://127.0.0.1:6379/0"
        env["REDIS_URL"] = local if not force and redis_answers(local) else throwaway_redis(stack)
    if not env.get("CELERY_BROKER_URL"):  # the worker's broker: the same Redis, its own database
        env["CELERY_BROKER_URL"] = redis_database(env["REDIS_URL"], 1)
    for name in ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"):
        log(f"{name}={env[name]}")


def redis_database(url: str, number: int) -> str:
    """`url` with its database number replaced: redis://host:port/0 -> redis://host:port/1."""
    base, _, tail = url.rpartition("/")
    return f"{base}/{number}" if tail.isdigit() and base.count("/") >= 2 else f"{url.rstrip('/')}/{number}"


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    env = dict(os.environ)
    with ExitStack() as stack:
        provide(stack, env)
        return subprocess.call(argv, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
