"""API tokens: shown once, stored hashed, expiring, revocable, with a last-used time."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken

ROOT = Path(__file__).resolve().parents[2]


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_a_new_token_is_shown_once_and_stored_only_as_a_hash(clients, users):
    response = clients["owner"].post("/api/v1/tokens/", {"name": "ci", "expires_in_days": 7}, format="json")
    assert response.status_code == 201
    raw = response.json()["token"]
    token = ApiToken.objects.get(pk=response.json()["id"])
    assert token.key_hash == hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in str(ApiToken.objects.filter(pk=token.pk).values().get())
    assert timedelta(days=6) < token.expires_at - timezone.now() <= timedelta(days=7)
    listed = clients["owner"].get("/api/v1/tokens/").json()["results"]
    assert all("token" not in item for item in listed)
    assert bearer(raw).get("/api/v1/me/").json()["username"] == "owner"


def test_last_used_time_is_recorded(users):
    token, raw = ApiToken.issue(users["viewer"], "t")
    assert token.last_used_at is None
    assert bearer(raw).get("/api/v1/me/").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_a_revoked_token_stops_working_and_stays_listed(clients, users):
    token, raw = ApiToken.issue(users["owner"], "old")
    assert clients["owner"].delete(f"/api/v1/tokens/{token.pk}/").status_code == 204
    response = bearer(raw).get("/api/v1/me/")
    assert response.status_code == 401
    assert response.json()["detail"] == "Invalid, expired or revoked token."
    token.refresh_from_db()
    assert token.revoked_at is not None and not token.is_active


def test_an_expired_token_is_refused(users):
    _, raw = ApiToken.issue(users["owner"], "short", expires_at=timezone.now() - timedelta(seconds=1))
    assert bearer(raw).get("/api/v1/me/").status_code == 401


def test_a_user_cannot_see_or_revoke_anothers_token(clients, users):
    token, _ = ApiToken.issue(users["owner"], "mine")
    assert clients["stranger"].get(f"/api/v1/tokens/{token.pk}/").status_code == 404
    assert clients["stranger"].delete(f"/api/v1/tokens/{token.pk}/").status_code == 404
    token.refresh_from_db()
    assert token.is_active


def test_garbage_credentials_are_a_401_not_a_crash(db):
    for header in ("Bearer", "Bearer a b", "Bearer asc_unknown"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        assert client.get("/api/v1/me/").status_code == 401


def test_createtoken_creates_the_user_and_prints_the_token_last(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "ASCENT_VAR_DIR": str(tmp_path), "DJANGO_SETTINGS_MODULE": "ascent.settings"}
    run = lambda *args: subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,  # noqa: E731
                                       capture_output=True, text=True, timeout=120)
    assert run("migrate", "--noinput").returncode == 0
    first = run("createtoken", "carol", "--days", "0")
    assert first.returncode == 0, first.stderr
    raw = first.stdout.strip().splitlines()[-1]
    assert raw.startswith("asc_") and "Created user carol" in first.stderr
    second = run("createtoken", "carol")
    assert "User carol" in second.stderr and second.stdout.strip().splitlines()[-1] != raw
    check = run("shell", "-c", "from accounts.models import ApiToken as T; "
                "print(sorted((t.user.username, t.expires_at is None) for t in T.objects.all()))")
    assert check.stdout.strip().splitlines()[-1] == "[('carol', False), ('carol', True)]"
    assert run("createtoken", "carol", "--days", "-1").returncode != 0
