"""Browser tests: Playwright drives Debian's Chromium, headless, against the live test server.

`make test` installs Chromium (`make browser`) and sets ASCENT_CHROMIUM; Playwright never
downloads a browser of its own. Every page a test opens is watched: an error in the browser
console or an uncaught script error fails the test. Screenshots go to ASCENT_SCREENSHOTS_DIR
(default var/screenshots; `make screenshots` refreshes docs/images/ui).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from accounts.choices import Role
from accounts.models import Membership, Project
from experiments.models import Experiment, Run

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("ASCENT_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(os.environ.get("ASCENT_SCREENSHOTS_DIR", ROOT / "var" / "screenshots"))
# Chromium flags for a closed network and a root user (as in CI).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def browser():
    """Chromium for one test module. Playwright's sync API keeps an asyncio loop running in this
    thread while it lives, which Django's ORM takes for an async context: the module's tests may
    use the ORM anyway (DJANGO_ALLOW_ASYNC_UNSAFE, as Playwright's own Django guide says), and
    the loop ends with the module, before any other test runs."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"No Chromium at {CHROMIUM}: run `make browser` (Debian: apt-get install "
                    "chromium) or set ASCENT_CHROMIUM to its path.", pytrace=False)
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


class ConsoleWatch:
    """Errors the page printed to the console or threw, minus those a test said to expect."""

    def __init__(self):
        self.errors: list[str] = []
        self.expected: list[re.Pattern] = []

    def expect(self, pattern: str) -> None:
        self.expected.append(re.compile(pattern))

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(p.search(e) for p in self.expected)]


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    """Passwords hashed with MD5: the production PBKDF2 takes a quarter of a second per hash on
    2 cores, and `team` makes five users with passwords for every test. Signing in checks a
    password the same way with either hasher. A keep-alive every second on log streams, so a
    stream whose page was closed notices at its next write and ends (see `page`)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.ASCENT_LOG_STREAM_HEARTBEAT_S = 1


def _wait_for_streams_to_end(timeout: float = 15.0) -> None:
    """Until the live server has ended every log stream (each holds a slot row while open).
    A run page's stream reads the database every second on a server thread; left running, its
    reads could deadlock with the table flush that ends a transactional test."""
    from api.models import StreamSlot

    deadline = time.monotonic() + timeout
    while StreamSlot.objects.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"log streams still open {timeout:.0f} s after their pages were closed: "
                        f"{list(StreamSlot.objects.values_list('key', flat=True))}")
        time.sleep(0.1)


def _wait_for_requests_to_end(timeout: float = 5.0) -> None:
    """Until no other connection to the test database is inside a query or a transaction: a
    request the closed page sent just before (a poll of the run page) may still be running on
    a live-server thread, and its locks taken in another order than the table flush that ends
    a transactional test deadlock with it. Past `timeout` the flush goes ahead (a worker of
    another test may be polling the queue every second)."""
    from django.db import connection

    deadline, quiet_since = time.monotonic() + timeout, None
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND pid <> pg_backend_pid() AND state IN "
                           "('active', 'idle in transaction')")
            now = time.monotonic()
            if cursor.fetchone()[0]:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= 0.2:  # a request sent before the close has arrived by now
                return
            time.sleep(0.05)


@pytest.fixture
def console():
    return ConsoleWatch()


@pytest.fixture
def page(browser, live_server, console):
    """A fresh browser context and page on the live server; fails the test on console errors."""
    context = browser.new_context(base_url=live_server.url, viewport={"width": 1360, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and console.errors.append(
        f"console: {m.text} ({m.location.get('url', '')})"))
    page.on("pageerror", lambda exc: console.errors.append(f"page error: {exc}"))
    yield page
    context.close()
    _wait_for_streams_to_end()
    _wait_for_requests_to_end()
    assert not console.unexpected(), "errors in the browser console:\n" + "\n".join(console.unexpected())


@pytest.fixture
def sign_in(page, live_server):
    """sign_in(user): give the page's browser a session of `user` (the sign-in form itself has a
    test of its own)."""

    def sign_in(user) -> None:
        client = Client()
        client.force_login(user)
        cookie = client.cookies[settings.SESSION_COOKIE_NAME]
        page.context.add_cookies([{"name": cookie.key, "value": cookie.value,
                                   "url": live_server.url}])

    return sign_in


def screenshot(page, name: str, locator=None) -> Path:
    """A full-page PNG of what the page shows now (or of `locator` only), as
    SCREENSHOTS/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    if locator is not None:
        locator.screenshot(path=str(path))
    else:
        page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture
def team(django_user_model):
    """A project with an owner, a maintainer and a viewer, one experiment, and a staff admin."""
    users = {name: django_user_model.objects.create_user(name, password=f"{name}-pass-123")
             for name in ("owner", "maintainer", "viewer", "stranger")}
    users["admin"] = django_user_model.objects.create_user("admin", password="admin-pass-123",
                                                           is_staff=True, is_superuser=True)
    project = Project.objects.create(name="alpha", description="the alpha team")
    for name, role in (("owner", Role.OWNER), ("maintainer", Role.MAINTAINER),
                       ("viewer", Role.VIEWER)):
        Membership.objects.create(project=project, user=users[name], role=role)
    experiment = Experiment.objects.create(project=project, name="baseline",
                                           created_by=users["owner"])
    return {"users": users, "project": project, "experiment": experiment}


@pytest.fixture
def local_cluster(ray_head, dispatch_env):
    """The test Ray head as cluster `local`, its nodes already read (as the worker's probe does)."""
    from clusters.models import Cluster
    from workers.dispatch import probe

    cluster = Cluster.objects.create(name="local", device_type="cpu", ray_address=ray_head)
    probe(cluster.pk)
    return cluster


@pytest.fixture
def logged(team, mlflow_server, settings):
    """log(name, metrics, **run fields): a run whose metrics are in the test MLflow server."""
    from mlflow import MlflowClient

    settings.MLFLOW_TRACKING_URI = mlflow_server
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment_id = client.create_experiment(f"logged-{team['experiment'].pk}")

    def log(name: str, metrics: dict[str, list[float]], **fields) -> Run:
        mlflow_run_id = client.create_run(experiment_id).info.run_id
        for key, values in metrics.items():
            for step, value in enumerate(values, start=1):
                client.log_metric(mlflow_run_id, key, value, step=step)
        client.set_terminated(mlflow_run_id)
        return Run.objects.create(
            experiment=team["experiment"], algorithm="grpo", device_type="cpu", device_count=1,
            name=name, created_by=team["users"]["owner"], mlflow_run_id=mlflow_run_id,
            **{"state": "SUCCEEDED", "spec": {"model": {"path": "tiny:nano"}}, **fields})

    return log
