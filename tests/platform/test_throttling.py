"""Rate limits: sign-in lockout (UI form and admin), API throttles per token, user and address,
slow token guessing, and token minting. Every refusal is a 429 that says when to try again."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiToken
from ascent.envconf import env_rate

PASSWORD = "owner-pass-123"
SCHEMA = "/api/schema/?format=json"  # served to anonymous clients
LOCKED = "Too many failed sign-ins; try again in 15 minutes"


@pytest.fixture
def owner(users, settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast checks
    user = users["owner"]
    user.set_password(PASSWORD)
    user.is_staff = True  # so that /admin/login/ accepts the right password
    user.save()
    return user


def sign_in(client, password, url="/sign-in/"):
    return client.post(url, {"username": "owner", "password": password})


def fail(client, times, url="/sign-in/"):
    """Sign in with a wrong password `times` times; the last answer."""
    for _ in range(times):
        response = sign_in(client, "wrong", url)
        assert response.status_code in (200, 429)
    return response


def rates(settings, **changed):
    """Set DRF throttle rates for this test (the throttles read them on each request)."""
    current = settings.REST_FRAMEWORK
    settings.REST_FRAMEWORK = {**current, "DEFAULT_THROTTLE_RATES": {
        **current["DEFAULT_THROTTLE_RATES"], **changed}}


def assert_throttled(response):
    assert response.status_code == 429
    body = json.loads(response.content)
    assert body["error"] == "throttled" and "seconds" in body["detail"]
    assert int(response["Retry-After"]) > 0


# --- signing in -------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["/sign-in/", "/admin/login/"])
def test_it_refuses_the_11th_sign_in_even_with_the_right_password(owner, url):
    client = Client()
    assert fail(client, 9, url).status_code == 200
    locked = sign_in(client, "wrong", url)  # the 10th failure locks
    assert locked.status_code == 429 and LOCKED in locked.content.decode()
    refused = sign_in(client, PASSWORD, url)
    assert refused.status_code == 429 and LOCKED in refused.content.decode()
    assert 'data-testid="locked-out"' in refused.content.decode()  # the styled sign-in page
    assert "_auth_user_id" not in client.session


def test_the_lockout_ends_after_the_cool_off(owner):
    client = Client()
    fail(client, 10)
    assert sign_in(client, PASSWORD).status_code == 429
    # The cool-off counts from the last failure: move that failure 16 minutes into the past.
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert sign_in(client, PASSWORD).status_code == 302
    assert client.session["_auth_user_id"] == str(owner.pk)


def test_axes_reset_unlocks_at_once(owner):
    client = Client()
    fail(client, 10)
    call_command("axes_reset")
    assert sign_in(client, PASSWORD).status_code == 302


def test_a_successful_sign_in_resets_the_count(owner):
    client = Client()
    fail(client, 9)
    assert sign_in(client, PASSWORD).status_code == 302
    client = Client()
    fail(client, 9)
    assert sign_in(client, PASSWORD).status_code == 302


def test_the_lockout_is_per_username_and_address(owner, users):
    fail(Client(), 10)
    elsewhere = Client(REMOTE_ADDR="10.9.9.9")
    assert sign_in(elsewhere, PASSWORD).status_code == 302


# --- API throttles ----------------------------------------------------------------------------

def test_it_throttles_a_token_beyond_the_user_rate(clients, settings):
    rates(settings, user="3/min")
    for _ in range(3):
        assert clients["owner"].get("/api/v1/me/").status_code == 200
    assert_throttled(clients["owner"].get("/api/v1/me/"))
    assert clients["viewer"].get("/api/v1/me/").status_code == 200  # others keep their own budget


def test_a_signed_in_session_has_its_own_budget(users, settings):
    rates(settings, user="2/min")
    client = APIClient()
    client.force_login(users["owner"])
    assert [client.get("/api/v1/me/").status_code for _ in range(3)] == [200, 200, 429]


def test_it_throttles_anonymous_requests_per_address(db, settings):
    rates(settings, anon="2/min")
    client = APIClient()
    for _ in range(2):
        assert client.get(SCHEMA).status_code == 200
    assert_throttled(client.get(SCHEMA))
    # X-Forwarded-For is not believed unless the server is behind a proxy.
    assert_throttled(client.get(SCHEMA, HTTP_X_FORWARDED_FOR="10.1.2.3"))
    assert APIClient(REMOTE_ADDR="10.1.2.4").get(SCHEMA).status_code == 200


def test_behind_a_proxy_the_forwarded_address_counts(db, settings):
    rates(settings, anon="1/min")
    settings.ASCENT_BEHIND_PROXY = True
    client = APIClient()
    assert client.get(SCHEMA, HTTP_X_FORWARDED_FOR="10.1.2.3").status_code == 200
    assert client.get(SCHEMA, HTTP_X_FORWARDED_FOR="10.1.2.3").status_code == 429
    assert client.get(SCHEMA, HTTP_X_FORWARDED_FOR="spoofed, 10.1.2.5").status_code == 200


def test_it_limits_how_many_tokens_a_user_creates(clients, settings):
    rates(settings, **{"token-create": "2/hour"})
    for name in ("a", "b"):
        assert clients["owner"].post("/api/v1/tokens/", {"name": name}, format="json").status_code == 201
    assert_throttled(clients["owner"].post("/api/v1/tokens/", {"name": "c"}, format="json"))
    assert clients["owner"].get("/api/v1/tokens/").status_code == 200  # listing is not minting
    assert clients["viewer"].post("/api/v1/tokens/", {"name": "v"}, format="json").status_code == 201


# --- guessing tokens --------------------------------------------------------------------------

def bearer(raw, **extra) -> APIClient:
    client = APIClient(**extra)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_bad_tokens_from_an_address_are_refused_but_valid_ones_still_pass(users, settings):
    settings.ASCENT_TOKEN_FAILURE_LIMIT = 3
    _, good = ApiToken.issue(users["owner"], "good")
    for guess in ("asc_a", "asc_b", "asc_c"):
        assert bearer(guess).get("/api/v1/me/").status_code == 401
    refused = bearer("asc_d").get("/api/v1/me/")  # the address is over the limit
    assert_throttled(refused)
    assert "Too many invalid tokens from your address" in refused.json()["detail"]
    # Everyone else behind that address (one NAT) goes on working with their valid tokens.
    assert all(bearer(good).get("/api/v1/me/").status_code == 200 for _ in range(30))
    assert_throttled(bearer("asc_e").get("/api/v1/me/"))
    assert bearer("asc_f", REMOTE_ADDR="10.0.0.8").get("/api/v1/me/").status_code == 401


def test_valid_tokens_do_not_count_as_failures(users, settings):
    settings.ASCENT_TOKEN_FAILURE_LIMIT = 2
    _, good = ApiToken.issue(users["owner"], "good")
    assert all(bearer(good).get("/api/v1/me/").status_code == 200 for _ in range(5))


@pytest.mark.parametrize("value", ["60", "60/fortnight", "0/min", "x/min"])
def test_a_malformed_rate_stops_start_up_naming_the_variable(value):
    with pytest.raises(ImproperlyConfigured, match=f"ASCENT_API_RATE_USER='{value}' is not valid"):
        env_rate("ASCENT_API_RATE_USER", "1200/min", {"ASCENT_API_RATE_USER": value})
    assert env_rate("ASCENT_API_RATE_USER", "1200/min", {}) == "1200/min"
