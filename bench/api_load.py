"""Load benchmark of the runs API (list, detail, big pages) under gunicorn, with bearer tokens.

    .venv/bin/python bench/api_load.py [--runs 10000] [--clients 20] [--duration 10] \
        [--warmup 2] [--workers 2] [--threads 8] [--servers gthread,uvicorn] \
        [--cases list,detail,big,poll] [--big-clients 5] [--processes 4] [--streams 20]

It creates a throwaway PostgreSQL database (a new database on the server of DATABASE_URL when
that is set, else a throwaway server from scripts/testenv.py), migrates it, seeds N runs in bulk
across 4 projects, 12 experiments and 5 users (each run with a resolved RunSpec of about 3 KB),
then for each server kind starts gunicorn on 127.0.0.1 with the production settings (DEBUG off,
persistent database connections, throttle rates raised out of the way) and drives concurrent
keep-alive clients (http.client, threads spread over a few processes) for a fixed time:

  list    GET /api/v1/runs/                  (default page size, 50), --clients clients
  detail  GET /api/v1/runs/<id>/             (ids rotate over the visible runs), --clients clients
  big     GET /api/v1/runs/?page_size=500    --big-clients clients
  poll    GET /api/v1/runs/<id>/ with the If-None-Match of its ETag (a 304 each; the first 100
          ids), --clients clients: what a pipeline polling a run that has not changed costs

and prints req/s, p50/p90/p99 latency and errors for each, the CPU time gunicorn's processes
spent per request (PostgreSQL's not counted: the steadiest figure on a busy machine) and the
load average before and after. With --streams N it first opens N live log streams
(`runs/<id>/logs/?follow=1` of a running run, 4 per user, the default per-user cap) and keeps
them open through every case, while a probe asks `/healthz` every 0.2 s: it prints how many
streams the server took (a threaded server takes ASCENT_LOG_STREAMS_PER_SYNC_PROCESS per
process and refuses the rest with 429) and the probe's p50 and slowest answer and its failures
(no answer within 1 s) per case. Everything is on loopback; the servers and the database are
stopped and removed at the end. It never passes or fails on time.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import multiprocessing as mp
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
SERVERS = {
    "gthread": ["-k", "gthread", "ascent.wsgi:application"],
    "uvicorn": ["-k", "uvicorn_worker.UvicornWorker", "ascent.asgi:application"],
}
HIGH_RATE = "1000000/min"


# --- database -------------------------------------------------------------------------------

def throwaway_database(stack: ExitStack) -> str:
    """A fresh database URL; it and everything in it are removed when `stack` closes."""
    base = os.environ.get("DATABASE_URL")
    if not base:
        spec = importlib.util.spec_from_file_location("testenv", ROOT / "scripts" / "testenv.py")
        testenv = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(testenv)
        return testenv.throwaway_postgres(stack)
    import psycopg

    name = f"ascent_bench_{os.getpid()}"
    parts = urlsplit(base)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    stack.callback(_drop_database, base, name)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _drop_database(base: str, name: str) -> None:
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def django_env(database_url: str) -> dict[str, str]:
    return {
        **os.environ, "DATABASE_URL": database_url, "DATABASE_CONN_MAX_AGE": "600",
        "DJANGO_SETTINGS_MODULE": "ascent.settings_production", "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "ASCENT_API_RATE_USER": HIGH_RATE, "ASCENT_API_RATE_ANON": HIGH_RATE,
        "ASCENT_TOKEN_CREATE_RATE": HIGH_RATE, "STATIC_ROOT": str(ROOT / "var" / "bench-static"),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "platform"), str(ROOT)]),
    }


def prepare(env: dict[str, str], runs: int) -> dict:
    """Migrate and seed in a child process; returns the seed's token and run ids."""
    Path(env["STATIC_ROOT"]).mkdir(parents=True, exist_ok=True)
    migrate = subprocess.run([PYTHON, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT,
                             env=env, capture_output=True, text=True)
    if migrate.returncode:
        raise SystemExit(f"migrate failed:\n{migrate.stderr}")
    out = subprocess.run([PYTHON, __file__, "--seed-only", str(runs)], cwd=ROOT, env=env,
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def seed(count: int) -> dict:
    """Projects, experiments, users and `count` runs with realistic specs, in bulk."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connection

    from accounts.models import ApiToken, Membership, Project
    from clusters.models import Cluster
    from experiments.choices import RunState
    from experiments.models import Attempt, Experiment, LogChunk, Run
    from experiments.services import resolve_spec
    from rl_core.spec import PRESETS

    users = [get_user_model().objects.create_user(f"user{i}") for i in range(5)]
    projects = [Project.objects.create(name=f"team-{i}") for i in range(4)]
    for p, project in enumerate(projects):
        Membership.objects.bulk_create(
            Membership(project=project, user=u, role="maintainer")
            for i, u in enumerate(users) if (i + p) % 4 != 3)  # user0 sees 3 of the 4 projects
    experiments = [Experiment.objects.create(project=p, name=f"exp-{i}", created_by=users[i % 5])
                   for p in projects for i in range(3)]
    clusters = [Cluster.objects.create(name=f"c{i}", device_type="npu", ray_address="http://h:8265")
                for i in range(2)]
    specs = {a: resolve_spec({"algorithm": a, "data": {"synthetic": {"task": "addition"}}}, ())
             .model_dump(mode="json") for a in PRESETS}
    states, algos = list(RunState), list(PRESETS)
    Run.objects.bulk_create(
        (Run(experiment=experiments[i % len(experiments)], name=f"run-{i}",
             spec=specs[algos[i % len(algos)]], algorithm=algos[i % len(algos)],
             state=states[(i * 7) % len(states)], priority=i % 21 - 10,
             device_type=("npu", "gpu", "cpu")[i % 3], device_count=8,
             cluster=clusters[i % 2] if i % 5 == 0 else None, created_by=users[i % 5],
             error="out of memory" if i % 9 == 0 else "") for i in range(count)),
        batch_size=1000)
    with connection.cursor() as cursor:  # spread over time, so pages and filters see real ordering
        cursor.execute("UPDATE experiments_run SET created_at = now() - id * interval '1 minute'")
        cursor.execute("ANALYZE")
    visible = Run.objects.filter(experiment__project__memberships__user=users[0])
    _, raw = ApiToken.issue(users[0], "bench")
    # A running run with a log, in a project everyone is a member of, for the live streams.
    watched = Project.objects.create(name="watched")
    Membership.objects.bulk_create(Membership(project=watched, user=u, role="viewer") for u in users)
    run = Run.objects.create(experiment=Experiment.objects.create(project=watched, name="live"),
                             name="live", spec=specs["grpo"], algorithm="grpo",
                             state=RunState.RUNNING, device_type="cpu", device_count=1)
    attempt = Attempt.objects.create(run=run, number=1, cluster=clusters[0], device_count=1,
                                     ray_submission_id=Attempt.submission_id(run.pk, 1))
    LogChunk.objects.create(attempt=attempt, offset=0, text="step 1\n")
    return {"token": raw, "ids": list(visible.values_list("id", flat=True)[:500]),
            "stream_run": run.pk, "stream_tokens": [ApiToken.issue(u, "watch")[1] for u in users]}


# --- server ---------------------------------------------------------------------------------

def start_server(kind: str, env: dict[str, str], port: int, workers: int, threads: int):
    if kind == "uvicorn":  # under ASGI each request has its own connection: persistent ones leak
        env = {**env, "DATABASE_CONN_MAX_AGE": "0"}
    cmd = [PYTHON, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
           "--threads", str(threads), "--keep-alive", "30", "--log-level", "warning",
           *SERVERS[kind]]
    proc = subprocess.Popen(cmd, cwd=ROOT / "platform", env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.3)
    stop_server(proc)
    raise SystemExit(f"gunicorn ({kind}) did not answer on port {port} within 60 s")


def stop_server(proc) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --- clients --------------------------------------------------------------------------------

def client_thread(port, token, paths, start, warm_until, stop_at, out):
    """Asks for `paths` in turn; a (path, etag) entry is asked for with If-None-Match: etag,
    and answers 304."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    lat, errors, i = [], 0, start
    while (t0 := time.perf_counter()) < stop_at:
        path, etag = entry if isinstance(entry := paths[i % len(paths)], tuple) else (entry, None)
        try:
            conn.request("GET", path, headers=headers if etag is None
                         else {**headers, "If-None-Match": etag})
            resp = conn.getresponse()
            resp.read()
            ok = resp.status == (200 if etag is None else 304)
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            ok = False
        t1 = time.perf_counter()
        i += 1
        if t0 >= warm_until:
            lat.append(t1 - t0)
            errors += not ok
    out.append((lat, errors, i - start))


def client_process(port, token, paths, threads, offset, warm_until, stop_at, queue):
    out: list = []
    pool = [threading.Thread(target=client_thread,
                             args=(port, token, paths, offset + 37 * k, warm_until, stop_at, out))
            for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    queue.put(([x for lat, _, _ in out for x in lat], sum(e for _, e, _ in out),
               sum(n for _, _, n in out)))


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) used so far by the processes of a process group."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields[0] is the state; pgrp, then utime/stime at 11, 12
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def drive(port, token, paths, clients, processes, warmup, duration, server_pgid) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = min(processes, clients)
    split = [clients // procs + (k < clients % procs) for k in range(procs)]
    begin = time.perf_counter() + 1.0  # time for the children to start
    warm_until, stop_at = begin + warmup, begin + warmup + duration
    children = [ctx.Process(target=client_process,
                            args=(port, token, paths, n, 1000 * k, warm_until, stop_at, queue))
                for k, n in enumerate(split)]
    cpu = group_cpu_s(server_pgid)
    for c in children:
        c.start()
    results = [queue.get(timeout=warmup + duration + 120) for _ in children]
    cpu = group_cpu_s(server_pgid) - cpu
    for c in children:
        c.join()
    lat = sorted(x for r in results for x in r[0])
    served = max(1, sum(r[2] for r in results))  # with the warm-up's, for the CPU per request
    return {"requests": len(lat), "rps": len(lat) / duration, "errors": sum(r[1] for r in results),
            "cpu_ms": 1000 * cpu / served,
            **{f"p{q}": pct(lat, q) for q in (50, 90, 99)}}


class Streams:
    """`count` live log streams held open (4 per user) until `close()`, and a probe that asks
    /healthz every 0.2 s, timing each answer (1 s at most)."""

    def __init__(self, port: int, run_id: int, tokens: list[str], count: int):
        self.port, self.path, self.stop = port, f"/api/v1/runs/{run_id}/logs/?follow=1", threading.Event()
        self.statuses: list[int] = []
        self.conns = [self._open(tokens[(k // 4) % len(tokens)]) for k in range(count)]
        self.probes: list[float | None] = []
        self.prober = threading.Thread(target=self._probe, daemon=True)
        self.prober.start()

    def _open(self, token: str):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", self.path, headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        self.statuses.append(response.status)
        if response.status == 200:
            response.readline()  # the stream has begun; its socket stays open, unread
        else:
            response.read()
        return conn

    def _probe(self):
        while not self.stop.wait(0.2):
            t0 = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                conn.request("GET", "/healthz")
                ok = conn.getresponse().status == 200
                conn.close()
            except (OSError, http.client.HTTPException):
                ok = False
            self.probes.append(time.perf_counter() - t0 if ok else None)

    def take_probes(self) -> tuple[float, float, int]:
        """p50 and slowest answer (ms) and failures since the last call."""
        probes, self.probes = self.probes, []
        answered = sorted(p for p in probes if p is not None)
        slowest = 1000 * answered[-1] if answered else float("nan")
        return pct(answered, 50), slowest, len(probes) - len(answered)

    def close(self) -> None:
        self.stop.set()
        self.prober.join()
        for conn in self.conns:
            conn.close()


def pct(values: list[float], q: int) -> float:
    return 1000 * values[min(len(values) - 1, int(len(values) * q / 100))] if values else float("nan")


# --- main -----------------------------------------------------------------------------------

def cases(args, ids) -> list[tuple[str, list, int]]:
    table = {
        "list": (["/api/v1/runs/"], args.clients),
        "detail": ([f"/api/v1/runs/{i}/" for i in ids], args.clients),
        "big": (["/api/v1/runs/?page_size=500"], args.big_clients),
        "poll": ([(f"/api/v1/runs/{i}/", None) for i in ids[:100]], args.clients),
    }
    return [(name, *table[name]) for name in args.cases.split(",")]


def with_etags(port: int, token: str, paths: list) -> list:
    """(path, its current ETag) for each (path, None) entry of `paths`; others as they are."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    found = []
    for entry in paths:
        if isinstance(entry, tuple):
            conn.request("GET", entry[0], headers={"Authorization": f"Bearer {token}",
                                                   "Accept": "application/json"})
            resp = conn.getresponse()
            resp.read()
            entry = (entry[0], resp.getheader("ETag"))
        found.append(entry)
    conn.close()
    return found


def report(kind, name, clients, result, load, probes=None) -> None:
    health = "" if probes is None else f"   {probes[0]:6.1f} {probes[1]:7.1f} {probes[2]:4d}"
    print(f"{kind:8} {name:7} {clients:7d} {result['rps']:8.1f} {result['p50']:8.1f} "
          f"{result['p90']:8.1f} {result['p99']:8.1f} {result['errors']:6d} {result['requests']:8d}"
          f" {result['cpu_ms']:9.1f}"
          f"   {load[0]:.2f} / {load[1]:.2f}{health}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--big-clients", type=int, default=5)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per case")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds not measured first")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--processes", type=int, default=4, help="client processes")
    parser.add_argument("--servers", default="gthread,uvicorn")
    parser.add_argument("--cases", default="list,detail,big")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--streams", type=int, default=0,
                        help="live log streams held open beside the load, /healthz probed")
    parser.add_argument("--seed-only", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seed_only is not None:
        print(json.dumps(seed(args.seed_only)))
        return
    with ExitStack() as stack:
        env = django_env(throwaway_database(stack))
        t0 = time.monotonic()
        seeded = prepare(env, args.runs)
        print(f"seeded {args.runs} runs in {time.monotonic() - t0:.1f} s; "
              f"{os.cpu_count()} CPUs; workers {args.workers} x threads {args.threads}")
        print("server   case    clients    req/s   p50 ms   p90 ms   p99 ms errors requests"
              " cpu ms/req   load before / after"
              + ("   healthz p50 ms, max ms, failed" if args.streams else ""))
        for kind in args.servers.split(","):
            proc = start_server(kind, env, args.port, args.workers, args.threads)
            streams = None
            try:
                if args.streams:
                    streams = Streams(args.port, seeded["stream_run"], seeded["stream_tokens"],
                                      args.streams)
                    taken = streams.statuses.count(200)
                    print(f"{kind:8} streams: {taken} of {args.streams} open, "
                          f"{args.streams - taken} refused (statuses {sorted(set(streams.statuses))})",
                          flush=True)
                for name, paths, clients in cases(args, seeded["ids"]):
                    paths = with_etags(args.port, seeded["token"], paths)
                    before = os.getloadavg()[0]
                    if streams:
                        streams.take_probes()
                    result = drive(args.port, seeded["token"], paths, clients, args.processes,
                                   args.warmup, args.duration, proc.pid)
                    report(kind, name, clients, result, (before, os.getloadavg()[0]),
                           streams.take_probes() if streams else None)
            finally:
                if streams:
                    streams.close()
                stop_server(proc)


if __name__ == "__main__":
    main()
