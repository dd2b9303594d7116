"""Every page of the web UI answers with the Content-Security-Policy, and none carries what that
policy refuses (inline scripts, inline event handlers, style attributes)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from experiments.models import Run

POLICY = {
    "default-src": "'self'",
    "script-src": "'self'",
    "style-src": "'self'",
    "img-src": "'self' data:",
    "connect-src": "'self'",
    "object-src": "'none'",
    "base-uri": "'self'",
    "form-action": "'self'",
    "frame-ancestors": "'none'",
}
INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>")
INLINE_HANDLER = re.compile(r"<[^>]+\son[a-z]+=", re.IGNORECASE)
STYLE_ATTRIBUTE = re.compile(r"<[^>]+\sstyle=", re.IGNORECASE)


def policy_of(response) -> dict[str, str]:
    directives = (part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";"))
    return {name: value for name, value in directives}


@pytest.fixture
def maintainer(users, project) -> Client:
    client = Client()
    client.force_login(users["maintainer"])
    return client


@pytest.fixture
def active_run(experiment, cluster) -> Run:
    return Run.objects.create(experiment=experiment, spec={}, algorithm="grpo", device_type="npu",
                              device_count=8, state="RUNNING", name="csp")


def ui_pages(run: Run) -> list[str]:
    return ["/", "/runs/", "/runs/new/", f"/runs/{run.pk}/", f"/runs/{run.pk}/status/",
            f"/compare/?runs={run.pk}", "/clusters/", "/settings/", "/no-such-page/"]


def test_it_sends_the_policy_with_every_ui_page(maintainer, active_run):
    for url in ui_pages(active_run):
        response = maintainer.get(url)
        assert response.status_code in (200, 404), url
        assert policy_of(response) == POLICY, url


def test_it_sends_the_policy_to_anonymous_visitors(client, db):
    for url in ("/sign-in/", "/no-such-page/", "/api/v1/runs/"):
        assert policy_of(client.get(url)) == POLICY, url


def test_no_ui_page_carries_what_the_policy_refuses(maintainer, active_run):
    for url in ui_pages(active_run):
        page = maintainer.get(url).content.decode()
        assert not INLINE_SCRIPT.search(page), (url, INLINE_SCRIPT.search(page))
        assert not INLINE_HANDLER.search(page), (url, INLINE_HANDLER.search(page))
        assert not STYLE_ATTRIBUTE.search(page), (url, STYLE_ATTRIBUTE.search(page))


def test_the_api_docs_allow_their_own_inline_code_by_nonce(client, db):
    response = client.get("/api/docs/")
    policy = policy_of(response)
    nonce = re.search(r"'nonce-([^']+)'", policy["script-src"]).group(1)
    assert policy["script-src"] == f"'self' 'nonce-{nonce}'"
    assert policy["style-src"] == f"'self' 'nonce-{nonce}'"
    assert {k: v for k, v in policy.items() if k not in ("script-src", "style-src")} == {
        k: v for k, v in POLICY.items() if k not in ("script-src", "style-src")}
    page = response.content.decode()
    assert f'<script nonce="{nonce}">' in page and f'<style nonce="{nonce}">' in page
