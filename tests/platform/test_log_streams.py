"""Live log streams cannot exhaust the web server: caps on open streams per user and in all,
shared by every process through the database (429 beyond them), a cap per threaded process so
its threads stay free, keep-alive comments on a timer, a time limit, and, under gunicorn's ASGI
worker, 20 open streams while health checks and the rest of the API still answer at once."""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
import time
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from accounts.choices import Role
from accounts.models import ApiToken, Membership
from api.models import StreamSlot
from experiments.models import Attempt, LogChunk, Run
from tests.platform.embedded_server import ROOT, serve

BIN = Path(sys.executable).parent


@pytest.fixture
def free_slots(users):
    """No stream slot left by another test (a server's process may outlive its stream)."""
    StreamSlot.objects.all().delete()
    yield
    StreamSlot.objects.all().delete()


def _running_run(experiment, cluster=None) -> Run:
    return Run.objects.create(experiment=experiment, spec={}, algorithm="grpo", state="RUNNING",
                              cluster=cluster, device_type="npu", device_count=8,
                              created_by=experiment.created_by)


@pytest.fixture
def running(experiment, cluster):
    """A RUNNING run of the owner's project whose first attempt has logged 24 characters."""
    run = _running_run(experiment, cluster)
    attempt = Attempt.objects.create(run=run, number=1, cluster=cluster, device_count=8,
                                     ray_submission_id=Attempt.submission_id(run.pk, 1))
    LogChunk.objects.create(attempt=attempt, offset=0, text="step 1: reward/mean=0.1\n")
    Attempt.objects.filter(pk=attempt.pk).update(log_offset=24)
    return run, attempt


@pytest.fixture
def streams(transactional_db):
    """Opens follow streams with the test client and closes whatever is left at the end. The
    database commits (as a server's would): closing a stream ends its request, which closes the
    request's database connection."""
    opened = []

    def open_(client, run):
        response = client.get(f"/api/v1/runs/{run.pk}/logs/?follow=1")
        if response.status_code == 200:
            opened.append(response)
            next(iter(response.streaming_content))  # the stream has started
        return response

    yield open_
    for response in opened:
        response.close()


@override_settings(ASCENT_LOG_STREAMS_PER_USER=2)
def test_it_answers_429_beyond_the_streams_a_user_may_hold_open(clients, running, streams,
                                                                free_slots):
    run, _ = running
    first, second = streams(clients["owner"], run), streams(clients["owner"], run)
    assert first.status_code == second.status_code == 200
    third = streams(clients["owner"], run)
    assert third.status_code == 429
    assert 1 <= int(third["Retry-After"]) <= 300
    body = third.json()
    assert body["error"] == "throttled"
    assert "already have 2 log streams open" in body["detail"] and "limit is 2" in body["detail"]
    assert streams(clients["maintainer"], run).status_code == 200


@override_settings(ASCENT_LOG_STREAMS_PER_USER=2)
def test_slots_held_by_another_process_count_and_expired_ones_are_taken_over(
        clients, running, streams, users, free_slots):
    run, _ = running
    later = timezone.now() + timedelta(seconds=100)
    # Another web process (or host) serves one of the owner's streams: its claim is a row.
    StreamSlot.objects.create(key=f"user:{users['owner'].pk}:0", token="elsewhere",
                              expires_at=later)
    assert streams(clients["owner"], run).status_code == 200
    refused = streams(clients["owner"], run)
    assert refused.status_code == 429 and "already have 2 log streams open" in refused.json()["detail"]
    assert 30 <= int(refused["Retry-After"]) <= 40  # when that one reaches its time limit
    # A claim of a process that crashed expires: its slot is free again.
    StreamSlot.objects.filter(token="elsewhere").update(expires_at=timezone.now())
    assert streams(clients["owner"], run).status_code == 200
    assert not StreamSlot.objects.filter(token="elsewhere").exists()


@pytest.mark.parametrize(("limit", "words"), [
    ("ASCENT_LOG_STREAMS_TOTAL", "The service already serves 2 log streams"),
    # the test client is WSGI: each stream would hold one of the process's threads
    ("ASCENT_LOG_STREAMS_PER_SYNC_PROCESS", "process already serves 2 log streams on its threads"),
])
def test_beyond_the_services_or_a_threaded_processs_streams_one_more_waits(
        clients, running, streams, free_slots, settings, limit, words):
    setattr(settings, limit, 2)
    run, _ = running
    assert streams(clients["owner"], run).status_code == 200
    second = streams(clients["maintainer"], run)
    assert second.status_code == 200
    refused = streams(clients["viewer"], run)
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert words in refused.json()["detail"] and limit in refused.json()["detail"]
    assert StreamSlot.objects.count() == 4  # the refused one holds no slot of its user either
    second.close()
    assert streams(clients["viewer"], run).status_code == 200


@override_settings(ASCENT_LOG_STREAMS_PER_USER=2)
def test_it_frees_a_slot_when_a_stream_is_closed(clients, running, streams, free_slots):
    run, _ = running
    first, _ = streams(clients["owner"], run), streams(clients["owner"], run)
    assert streams(clients["owner"], run).status_code == 429
    first.close()
    assert streams(clients["owner"], run).status_code == 200


@override_settings(ASCENT_LOG_STREAMS_PER_USER=1)
def test_it_frees_the_slot_of_a_stream_that_never_started(clients, running, transactional_db,
                                                          free_slots):
    run, _ = running
    unread = clients["owner"].get(f"/api/v1/runs/{run.pk}/logs/?follow=1")
    assert clients["owner"].get(f"/api/v1/runs/{run.pk}/logs/?follow=1").status_code == 429
    unread.close()
    again = clients["owner"].get(f"/api/v1/runs/{run.pk}/logs/?follow=1")
    assert again.status_code == 200
    again.close()


@override_settings(ASCENT_LOG_STREAMS_PER_USER=1, ASCENT_LOG_STREAM_HEARTBEAT_S=0.2,
                   ASCENT_LOG_STREAM_LIMIT_S=1.2)
def test_it_sends_keep_alives_on_its_own_timer_and_ends_at_the_time_limit(
        clients, experiment, transactional_db, free_slots):
    run = _running_run(experiment)  # nothing logged yet
    started = time.monotonic()
    response = clients["owner"].get(f"/api/v1/runs/{run.pk}/logs/?follow=1")
    chunks = [(time.monotonic() - started, chunk.decode()) for chunk in response.streaming_content]
    beats = [at for at, chunk in chunks if chunk == ": keep-alive\n\n"]
    assert len(beats) >= 5, chunks  # every 0.2 s, not once per 1 s poll
    assert all(later - earlier < 0.45 for earlier, later in zip(beats, beats[1:])), chunks
    assert chunks[-1][1].startswith("event: end\n")
    assert json.loads(chunks[-1][1].split("data: ", 1)[1])["state"] == "RUNNING"
    assert 1.1 < chunks[-1][0] < 3
    again = clients["owner"].get(f"/api/v1/runs/{run.pk}/logs/?follow=1")  # the slot came back
    assert again.status_code == 200
    again.close()


# --- the production server: gunicorn with the uvicorn worker ---------------------------------

WATCHERS = 20


def _gunicorn_env() -> dict[str, str]:
    db = connection.settings_dict
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "ascent.settings", "PYTHONUNBUFFERED": "1",
           "DATABASE_URL": f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT']}"
                           f"/{db['NAME']}",
           "ASCENT_LOG_STREAM_LIMIT_S": "20", "ASCENT_LOG_STREAM_HEARTBEAT_S": "1"}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    return env


def _compose_services() -> dict:
    return yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"]


def _streams_command() -> list[str]:
    """The command of deploy/compose.yaml's `web-streams`, the service that serves log streams."""
    return _compose_services()["web-streams"]["command"].split()


def test_log_streams_are_served_by_the_asgi_worker_and_routed_there_by_the_proxy():
    command = _streams_command()
    assert command[:2] == ["gunicorn", "ascent.asgi:application"]
    assert command[command.index("--worker-class") + 1] == "uvicorn_worker.UvicornWorker"
    # Every other request goes to the image's threaded WSGI server.
    cmd = next(line for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
               if line.startswith("CMD "))
    image = json.loads(cmd[len("CMD "):])
    assert image[:2] == ["gunicorn", "ascent.wsgi"] and "gthread" in image
    assert "command" not in _compose_services()["web"]
    caddy = (ROOT / "deploy" / "Caddyfile").read_text()
    for matcher in ("@follow", "@eventstream"):
        assert f"handle {matcher} {{\n\t\treverse_proxy web-streams:8000" in caddy
    assert "query follow=1 follow=true follow=yes" in caddy
    assert "header Accept *text/event-stream*" in caddy


def _local_command(port: int) -> list[str]:
    """The streams service's command line on a local port with one worker (the image sets
    PYTHONPATH)."""
    command = _streams_command()
    command[command.index("--bind") + 1] = f"127.0.0.1:{port}"
    command[command.index("--workers") + 1] = "1"
    return [str(BIN / "gunicorn"), "--pythonpath", "platform,.", *command[1:]]


@pytest.fixture
def gunicorn(transactional_db, tmp_path):
    """The streams service's gunicorn command line (ASGI worker) with one worker, on the test
    database."""
    with serve(_local_command, _gunicorn_env(), tmp_path / "gunicorn.log") as base:
        yield base


class Watcher(threading.Thread):
    """Reads one follow stream to its end, keeping its events."""

    def __init__(self, url: str, token: str):
        super().__init__(daemon=True)
        self.request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        self.started, self.events, self.error = threading.Event(), [], None

    def run(self):
        try:
            with urllib.request.urlopen(self.request, timeout=30) as stream:
                for line in stream:
                    self.started.set()
                    if line.startswith(b"event: "):
                        self.events.append([line[7:].decode().strip()])
                    elif line.startswith(b"data: "):
                        self.events[-1].append(json.loads(line[6:]))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
            self.started.set()

    def text(self) -> str:
        return "".join(data["text"] for name, data in self.events if name == "log")


def _timed_get(url: str, token: str | None = None) -> float:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    started = time.monotonic()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
        assert answer.status == 200
        answer.read()
    return time.monotonic() - started


def _viewers(project, count: int) -> list[str]:
    tokens = []
    for index in range(count):
        user = get_user_model().objects.create_user(f"watcher{index}")
        Membership.objects.create(project=project, user=user, role=Role.VIEWER)
        tokens.append(ApiToken.issue(user, "stream")[1])
    return tokens


def _wait_for(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.1)
    return check()


def test_it_serves_many_streams_while_health_checks_and_the_api_answer(gunicorn, running,
                                                                      project, users):
    run, attempt = running
    url = f"{gunicorn}/api/v1/runs/{run.pk}/logs/?follow=1"
    watchers = [Watcher(url, token) for token in _viewers(project, WATCHERS)]
    for watcher in watchers:
        watcher.start()
    assert all(w.started.wait(15) for w in watchers)
    assert [w.error for w in watchers] == [None] * WATCHERS
    owner = ApiToken.issue(users["owner"], "check")[1]
    # Every probe is answered while the 20 streams are open (bench/api_load.py --streams 20
    # measures how fast, beside a load of API requests).
    assert all(_timed_get(f"{gunicorn}/healthz") < 3 for _ in range(5))
    assert _timed_get(f"{gunicorn}/api/v1/runs/{run.pk}/", owner) < 3

    LogChunk.objects.create(attempt=attempt, offset=24, text="step 2: reward/mean=0.3\n")
    Attempt.objects.filter(pk=attempt.pk).update(log_offset=48)
    assert _wait_for(lambda: all("step 2" in w.text() for w in watchers), 10)
    Attempt.objects.filter(pk=attempt.pk).update(ended_at=timezone.now(), exit_code=0)
    Run.objects.filter(pk=run.pk).update(state="SUCCEEDED")
    for watcher in watchers:
        watcher.join(10)
    assert not any(w.is_alive() for w in watchers)
    for watcher in watchers:
        assert watcher.text() == "step 1: reward/mean=0.1\nstep 2: reward/mean=0.3\n"
        assert watcher.events[-1] == ["end", {"attempt": 1, "offset": 48, "state": "SUCCEEDED"}]


def _open_stream(base: str, path: str, token: str) -> tuple[http.client.HTTPConnection, object]:
    """A follow stream over its own connection, and its response once the stream has begun."""
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=10)
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    response = conn.getresponse()
    if response.status == 200:
        response.readline()
    return conn, response


def test_it_frees_the_slot_of_a_client_that_goes_away_under_asgi(gunicorn, running, users,
                                                                  free_slots):
    run, _ = running
    token, path = ApiToken.issue(users["owner"], "s")[1], f"/api/v1/runs/{run.pk}/logs/?follow=1"
    opened = [_open_stream(gunicorn, path, token) for _ in range(4)]  # the default cap
    try:
        assert [response.status for _, response in opened] == [200] * 4
        conn, refused = _open_stream(gunicorn, path, token)
        assert refused.status == 429 and int(refused.getheader("Retry-After")) >= 1
        assert json.loads(refused.read())["error"] == "throttled"
        conn.close()
        opened.pop()[0].close()  # the browser tab is closed: the socket goes away
        for _ in range(50):  # within 5 s
            opened.append(_open_stream(gunicorn, path, token))
            if opened[-1][1].status == 200:
                break
            time.sleep(0.1)
        assert opened[-1][1].status == 200
    finally:
        for conn, _ in opened:
            conn.close()


def _threaded_command(port: int) -> list[str]:
    """The image's threaded (WSGI) server on a local port: one worker with 4 threads."""
    cmd = next(line for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
               if line.startswith("CMD "))
    command = json.loads(cmd[len("CMD "):])
    command[command.index("--bind") + 1] = f"127.0.0.1:{port}"
    command[command.index("--workers") + 1] = "1"
    command[command.index("--threads") + 1] = "4"
    return [str(BIN / "gunicorn"), "--pythonpath", "platform,.", *command[1:]]


def test_streams_sent_to_the_threaded_server_leave_its_threads_for_other_requests(
        transactional_db, tmp_path, running, project, users, free_slots):
    run, _ = running
    env = {**_gunicorn_env(), "ASCENT_LOG_STREAMS_PER_SYNC_PROCESS": "2"}
    path = f"/api/v1/runs/{run.pk}/logs/?follow=1"
    with serve(_threaded_command, env, tmp_path / "gthread.log") as base:
        opened = [_open_stream(base, path, token) for token in _viewers(project, 4)]
        try:
            assert sorted(response.status for _, response in opened) == [200, 200, 429, 429]
            refused = next(response for _, response in opened if response.status == 429)
            assert "ASCENT_LOG_STREAMS_PER_SYNC_PROCESS" in json.loads(refused.read())["detail"]
            owner = ApiToken.issue(users["owner"], "check")[1]
            assert all(_timed_get(f"{base}/healthz") < 3 for _ in range(5))
            assert _timed_get(f"{base}/api/v1/runs/{run.pk}/", owner) < 3
        finally:
            for conn, _ in opened:
                conn.close()
