"""API tokens: shown once, stored hashed, expiring within the server's limit, revocable, with a
last-used time."""

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
    run = lambda *args, **more: subprocess.run(  # noqa: E731
        [sys.executable, "manage.py", *args], cwd=ROOT, env={**env, **more}, capture_output=True,
        text=True, timeout=120)
    assert run("migrate", "--noinput").returncode == 0
    first = run("createtoken", "carol", "--days", "0", ASCENT_TOKEN_MAX_DAYS="0")
    assert first.returncode == 0, first.stderr
    raw = first.stdout.strip().splitlines()[-1]
    assert raw.startswith("asc_") and "Created user carol" in first.stderr
    second = run("createtoken", "carol")
    assert "User carol" in second.stderr and second.stdout.strip().splitlines()[-1] != raw
    check = run("shell", "-c", "from accounts.models import ApiToken as T; "
                "print(sorted((t.user.username, t.expires_at is None) for t in T.objects.all()))")
    assert check.stdout.strip().splitlines()[-1] == "[('carol', False), ('carol', True)]"
    assert run("createtoken", "carol", "--days", "-1").returncode != 0
    too_long = run("createtoken", "carol", "--days", "400")
    assert too_long.returncode != 0 and "At most 365 days (ASCENT_TOKEN_MAX_DAYS)" in too_long.stderr
    never = run("createtoken", "carol", "--days", "0")
    assert never.returncode != 0 and "Tokens must expire on this server" in never.stderr


def create(client, **body):
    """A new token, named afresh each time (active tokens of a user have distinct names)."""
    create.count = getattr(create, "count", 0) + 1
    return client.post("/api/v1/tokens/", {"name": f"ci-{create.count}", **body}, format="json")


def test_it_refuses_a_lifetime_above_the_maximum_naming_the_field_and_limit(clients, settings):
    settings.ASCENT_TOKEN_MAX_DAYS = 30
    response = create(clients["owner"], expires_in_days=31)
    assert response.status_code == 400
    assert response.json()["errors"] == [
        {"field": "expires_in_days", "message": "At most 30 days (ASCENT_TOKEN_MAX_DAYS): give 1 to 30."}]
    assert create(clients["owner"], expires_in_days=30).status_code == 201


def test_a_token_never_expires_only_where_the_maximum_is_zero(clients, settings):
    refused = create(clients["owner"], expires_in_days=0)
    assert refused.status_code == 400 and refused.json()["errors"][0]["field"] == "expires_in_days"
    assert "ASCENT_TOKEN_MAX_DAYS=365" in refused.json()["errors"][0]["message"]
    settings.ASCENT_TOKEN_MAX_DAYS = 0
    allowed = create(clients["owner"], expires_in_days=0)
    assert allowed.status_code == 201 and allowed.json()["expires_at"] is None


def test_it_cannot_create_a_token_that_outlives_the_token_it_is_created_with(users):
    _, raw = ApiToken.issue(users["owner"], "week", expires_at=timezone.now() + timedelta(days=7, hours=1))
    refused = create(bearer(raw), expires_in_days=30)
    assert refused.status_code == 400
    error = refused.json()["errors"][0]
    assert error["field"] == "expires_in_days" and "ask for at most 7 days" in error["message"]
    assert create(bearer(raw), expires_in_days=7).status_code == 201
    # The default lifetime is shortened to the creating token's expiry instead of refused.
    default = create(bearer(raw))
    assert default.status_code == 201
    made = ApiToken.objects.get(pk=default.json()["id"])
    assert made.expires_at <= timezone.now() + timedelta(days=7, hours=1)


def test_a_signed_in_user_is_limited_only_by_the_maximum(users):
    client = APIClient()
    client.force_login(users["owner"])
    assert create(client, expires_in_days=365).status_code == 201
    assert create(client, expires_in_days=366).status_code == 400


def test_a_default_above_the_maximum_stops_start_up(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "ASCENT_VAR_DIR": str(tmp_path),
           "DJANGO_SETTINGS_MODULE": "ascent.settings",
           "ASCENT_TOKEN_DEFAULT_DAYS": "90", "ASCENT_TOKEN_MAX_DAYS": "30"}
    result = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0
    assert "ASCENT_TOKEN_DEFAULT_DAYS=90 exceeds ASCENT_TOKEN_MAX_DAYS=30" in result.stderr


def test_revoking_a_token_revokes_the_tokens_minted_with_it_at_any_depth(users, login):
    """A stolen token could otherwise mint a child and live on after its revocation."""
    _, raw = ApiToken.issue(users["owner"], "pipeline")
    child = create(bearer(raw), name="child").json()["token"]
    grandchild = create(bearer(child), name="grandchild").json()["token"]
    _, sibling = ApiToken.issue(users["owner"], "laptop")
    parent = ApiToken.objects.get(name="pipeline")
    assert bearer(grandchild).get("/api/v1/me/").status_code == 200

    assert bearer(sibling).delete(f"/api/v1/tokens/{parent.pk}/").status_code == 204
    for token in (raw, child, grandchild):
        assert bearer(token).get("/api/v1/me/").status_code == 401
    assert bearer(sibling).get("/api/v1/me/").status_code == 200  # not minted by it
    # the settings page revokes the same way
    _, second = ApiToken.issue(users["owner"], "second")
    minted = create(bearer(second), name="minted by second").json()["token"]
    owner = login("owner")
    owner.post(f"/settings/tokens/{ApiToken.objects.get(name='second').pk}/revoke/")
    assert bearer(minted).get("/api/v1/me/").status_code == 401
