"""Schemathesis over the live OpenAPI document: no operation answers 5xx or outside its schema.

The platform is served twice: the way `make run` serves it (embedded defaults, DEBUG,
`manage.py bootstrap`, runserver), and with the production settings under the image's gunicorn
command (DEBUG off, WhiteNoise's collected static files). Each is seeded through the API with a
project, an experiment and a run next to bootstrap's cluster `local` and its node. Every
operation is called with generated input and all of schemathesis' checks, authenticated as
bootstrap's administrator with a token of its own.
"""

from __future__ import annotations

import json
import secrets
import sys
import urllib.request
from pathlib import Path

import pytest
import schemathesis
from embedded_server import ROOT, embedded_env, manage, runserver, serve
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

MAX_EXAMPLES = 10


def _call(base: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"{base}{path}", method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def _seed(base: str, admin_token: str) -> str:
    """A project, an experiment and a queued run; returns a token for the fuzzer's requests."""
    project = _call(base, admin_token, "POST", "/api/v1/projects/", {"name": "fuzz"})
    experiment = _call(base, admin_token, "POST", "/api/v1/experiments/",
                       {"project": project["id"], "name": "baseline"})
    _call(base, admin_token, "POST", "/api/v1/runs/", {
        "experiment": experiment["id"], "name": "seed",
        "spec": {"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}}}})
    return _call(base, admin_token, "POST", "/api/v1/tokens/", {"name": "fuzzer"})["token"]


def _production(env: dict[str, str], tmp):
    """The production settings in `env`, static files collected; the image's gunicorn command
    (deploy/Dockerfile) with one worker, as a function of its port."""
    env.update(DJANGO_SETTINGS_MODULE="ascent.settings_production", DEBUG="0",
               SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="127.0.0.1,localhost",
               STATIC_ROOT=str(tmp / "static"))
    manage(env, "collectstatic", "--noinput", "-v", "0")
    cmd = next(line for line in (ROOT / "deploy" / "Dockerfile").read_text().splitlines()
               if line.startswith("CMD "))
    image = json.loads(cmd[len("CMD "):])

    def command(port: int) -> list[str]:
        args = list(image)
        args[args.index("--bind") + 1] = f"127.0.0.1:{port}"
        args[args.index("--workers") + 1] = "1"
        return [str(Path(sys.executable).parent / "gunicorn"), "--pythonpath", "platform,.",
                *args[1:]]

    return command


@pytest.fixture(scope="module", params=["development", "production"])
def live(request, tmp_path_factory):
    """The served platform, with the development or the production settings: yields (base URL,
    bearer token)."""
    tmp = tmp_path_factory.mktemp(f"schemathesis-{request.param}")
    env = embedded_env(tmp / "var")
    env.update(ASCENT_API_RATE_USER="1000000/min", ASCENT_API_RATE_ANON="1000000/min",
               ASCENT_TOKEN_CREATE_RATE="1000000/hour", ASCENT_INVITE_RATE="1000000/hour",
               ASCENT_TOKEN_FAILURE_LIMIT="1000000", ASCENT_LOG_STREAM_LIMIT_S="1",
               ASCENT_LOG_STREAM_HEARTBEAT_S="1")
    command = _production(env, tmp) if request.param == "production" else None
    manage(env, "migrate", "--noinput")
    manage(env, "bootstrap", "--host", "127.0.0.1")
    credentials = dict(line.split("=", 1) for line in
                       (tmp / "var" / "admin-credentials").read_text().split())
    server = (serve(command, env, tmp / "server.log") if command
              else runserver(env, tmp / "server.log"))
    with server as base:
        yield base, _seed(base, credentials["token"])


@pytest.fixture(scope="module")
def api_schema(live):
    base, _ = live
    schema = schemathesis.openapi.from_url(f"{base}/api/schema/?format=json")
    # Text fields refuse NUL characters with a 400 (PostgreSQL cannot store them), which a JSON
    # Schema cannot say; tests/platform/test_bad_input.py sends them.
    schema.config.generation.update(allow_x00=False)
    return schema


DOCUMENT = SchemaGenerator().get_schema(request=None, public=True)
# Revoking a token could revoke the fuzzer's own (ids are small integers), and every later request
# would be a 401; revocation is covered by tests/platform/test_tokens.py.
EXCLUDED = {("delete", "/api/v1/tokens/{id}/")}
OPERATIONS = [(method, path) for path, item in sorted(DOCUMENT["paths"].items()) for method in item
              if (method, path) not in EXCLUDED]


@pytest.mark.parametrize(("method", "path"), OPERATIONS,
                         ids=[f"{m.upper()} {p}" for m, p in OPERATIONS])
def test_it_answers_every_operation_within_its_schema(api_schema, live, method, path):
    _, token = live
    operation = api_schema[path][method.upper()]

    @given(case=operation.as_strategy())
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
              database=None)
    def check(case):
        headers = {"Authorization": f"Bearer {token}"}
        response = case.call(headers=headers, timeout=30)
        excluded = [positive_data_acceptance] if refused_for_state(response) else []
        case.validate_response(response, headers=headers, excluded_checks=excluded,
                               transport_kwargs={"headers": headers, "timeout": 30})

    check()


STATE_REFUSALS = ("does not exist", "Invalid pk", "There is no user named", "already exists",
                  "already has", "must make a unique set",
                  # the names of a user's active tokens are distinct
                  "You already have an active token named",
                  # the calling token's own expiry bounds a new token's lifetime, and the
                  # server's ASCENT_TOKEN_MAX_DAYS any token's
                  "cannot outlive the token", "Tokens must expire on this server",
                  # text is trimmed: a string of whitespace only (say "\x1e" or "\x85") is
                  # blank, which a JSON Schema's minLength cannot say
                  "This field may not be blank",
                  # a log's attempt number that the run does not have (yet)
                  "has no attempt",
                  # a node's healthy devices are at most its devices: a rule across two fields
                  # (and, for PATCH, across the body and the stored node)
                  "healthy devices exceed device_count",
                  # a webhook's URL is checked on what its host resolves to (nothing, here,
                  # or a loopback address), and its name is unique in the project
                  "Cannot resolve", "resolves to", "Use an http:// or https:// URL",
                  "Leave credentials out of the URL", "port is not a number",
                  "The project has a webhook of this name already",
                  # e-mail subscriptions are for projects you are a member of
                  "You are not a member of project")


def refused_for_state(response) -> bool:
    """A 400 about ids, names or attempts that do not exist, names already taken, a token's
    lifetime beyond the calling token's or the server's limit, text of whitespace only, a node's
    healthy devices beyond its devices, or a run spec's own cross-field rules (its JSON Schema is
    spec/schema/): schema-valid input that the API rightly refuses, as no JSON Schema of the
    body can say which objects exist or how two fields relate."""
    if response.status_code != 400:
        return False
    errors = response.json().get("errors", [])
    return bool(errors) and all(e["field"].split(".")[0] == "spec" or
                                any(s in e["message"] for s in STATE_REFUSALS) for e in errors)


def test_the_served_platform_answers_a_chunked_body_with_411(live):
    import http.client
    from urllib.parse import urlsplit

    base, token = live
    connection = http.client.HTTPConnection(urlsplit(base).netloc, timeout=30)
    connection.putrequest("POST", "/api/v1/runs/validate/")
    for name, value in (("Authorization", f"Bearer {token}"), ("Content-Type", "application/json"),
                        ("Transfer-Encoding", "chunked")):
        connection.putheader(name, value)
    connection.endheaders()  # the answer comes before any chunk is sent: the body is not read
    answer = connection.getresponse()
    assert answer.status == 411, answer.read()
    assert json.load(answer)["error"] == "length_required"
