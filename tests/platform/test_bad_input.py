"""Every operation of the OpenAPI document answers hostile input below 500, in the error shape.

The operations are read from the schema the server generates, so a new endpoint is covered as
soon as it is routed. Each is sent, as an administrator (who reaches every code path): an empty
object, NaN and Infinity, 300 levels of nesting, integers of 2**70 in the body, in query
parameters and in path ids, text/plain and form bodies, malformed JSON and a JSON array.
"""

from __future__ import annotations

import json

import pytest
from drf_spectacular.generators import SchemaGenerator

from experiments.services import Submission, submit_run

HUGE = 2**70
BODY_METHODS = ("post", "put", "patch")


DOCUMENT = SchemaGenerator().get_schema(request=None, public=True)
SCHEMAS = DOCUMENT["components"]["schemas"]


def operations(document: dict) -> list[tuple[str, str, dict]]:
    return [(method, path, operation) for path, item in sorted(document["paths"].items())
            for method, operation in item.items()]


OPERATIONS = operations(DOCUMENT)
BODY_OPERATIONS = [op for op in OPERATIONS if op[0] in BODY_METHODS]


@pytest.fixture
def seeded(project, experiment, cluster, users, tiny_spec):
    """One of each object, so that path ids resolve and bodies reach validation."""
    run, _ = submit_run(experiment, users["owner"], Submission(spec=tiny_spec))
    from accounts.models import ApiToken

    token, _ = ApiToken.issue(users["admin"], "spare")
    from notifications.models import Webhook

    hook = Webhook.objects.create(project=project, name="seeded", url="https://hooks.example.com/",
                                  events=["run.failed"])
    from registry.models import ModelVersion, RegisteredModel

    model = RegisteredModel.objects.create(project=project, name="seeded")
    version = ModelVersion.objects.create(model=model, run=run, step=1)
    return {"clusters": cluster.pk, "nodes": cluster.nodes.get().pk, "projects": project.pk,
            "experiments": experiment.pk, "runs": run.pk, "tokens": token.pk,
            "webhook_id": hook.pk, "models": model.pk, "model-versions": version.pk}


def url(path: str, seeded: dict, id_value=None) -> str:
    """The path with real ids (or `id_value` for every id) and a member's username."""
    resource = path.split("/")[3]
    ident = seeded.get(resource, 1) if id_value is None else id_value
    return (path.replace("{id}", str(ident)).replace("{username}", "viewer")
            .replace("{webhook_id}", str(seeded.get("webhook_id", 1))))


def request_properties(operation: dict, document_schemas: dict) -> dict:
    content = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    ref = content.get("schema", {}).get("$ref", "")
    return document_schemas.get(ref.rsplit("/", 1)[-1], {}).get("properties", {})


def _ids(ops: list) -> list[str]:
    return [f"{method.upper()} {path}" for method, path, _ in ops]


FIELD_OPERATIONS = [op for op in BODY_OPERATIONS if request_properties(op[2], SCHEMAS)]
QUERY_OPERATIONS = [op for op in OPERATIONS
                    if any(p["in"] == "query" for p in op[2].get("parameters", []))]
ID_OPERATIONS = [op for op in OPERATIONS if "{id}" in op[1]]


def send(client, method: str, path: str, body: bytes | str = b"",
         content_type: str = "application/json", **extra):
    return client.generic(method.upper(), path, body, content_type=content_type, **extra)


def assert_error_shape(response, allowed=None):
    """Below 500; an error is the API's JSON shape, a 400 with its `errors` list."""
    assert response.status_code < 500, response.content[:400]
    if allowed is not None:
        assert response.status_code in allowed, (response.status_code, response.content[:400])
    if response.status_code < 400 or response.status_code in (404, 405) and not response.get(
            "Content-Type", "").startswith("application/json"):
        return
    body = response.json()
    assert {"error", "detail"} <= set(body), body
    assert isinstance(body["detail"], str) and body["detail"], body
    if response.status_code == 400:
        assert isinstance(body.get("errors"), list) and body["errors"], body
        assert all({"field", "message"} <= set(item) for item in body["errors"]), body


def raw_json_with(operation, value: str) -> str:
    """A JSON object putting the raw JSON text `value` in every property of the body."""
    names = list(request_properties(operation, SCHEMAS)) or ["value"]
    return "{" + ", ".join(f'"{name}": {value}' for name in names) + "}"


@pytest.mark.parametrize(("method", "path", "operation"), BODY_OPERATIONS,
                         ids=_ids(BODY_OPERATIONS))
class TestBodies:
    def test_it_answers_an_empty_object(self, clients, seeded, method, path, operation):
        response = send(clients["admin"], method, url(path, seeded), "{}")
        assert_error_shape(response)

    @pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
    def test_it_refuses_nan_and_infinity(self, clients, seeded, method, path, operation, literal):
        response = send(clients["admin"], method, url(path, seeded), raw_json_with(operation, literal))
        assert_error_shape(response, allowed={400} if "requestBody" in operation else None)

    def test_it_refuses_300_levels_of_nesting(self, clients, seeded, method, path, operation):
        response = send(clients["admin"], method, url(path, seeded),
                        raw_json_with(operation, "[" * 300 + "]" * 300))
        assert_error_shape(response, allowed={400} if "requestBody" in operation else None)

    def test_it_answers_huge_integers_in_the_body(self, clients, seeded, method, path, operation):
        response = send(clients["admin"], method, url(path, seeded), raw_json_with(operation, str(HUGE)))
        assert_error_shape(response)

    @pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "application/octet-stream"])
    def test_it_refuses_other_content_types(self, clients, seeded, method, path, operation, content_type):
        response = send(clients["admin"], method, url(path, seeded), "name=x", content_type=content_type)
        assert_error_shape(response, allowed={415} if "requestBody" in operation else None)

    def test_it_answers_form_data(self, clients, seeded, method, path, operation):
        response = send(clients["admin"], method, url(path, seeded), "name=x&spec=1",
                        content_type="application/x-www-form-urlencoded")
        assert_error_shape(response)

    @pytest.mark.parametrize("text", ['{"name": ', "{'name': 1}", "\xff\xfe", "nul"])
    def test_it_refuses_malformed_json(self, clients, seeded, method, path, operation, text):
        response = send(clients["admin"], method, url(path, seeded), text.encode("latin-1"))
        assert_error_shape(response, allowed={400} if "requestBody" in operation else None)

    def test_it_refuses_a_json_array(self, clients, seeded, method, path, operation):
        response = send(clients["admin"], method, url(path, seeded), json.dumps([{"name": "x"}]))
        assert_error_shape(response, allowed={400} if "requestBody" in operation else None)


@pytest.mark.parametrize(("method", "path", "operation"), FIELD_OPERATIONS,
                         ids=_ids(FIELD_OPERATIONS))
def test_it_refuses_unknown_keys_naming_them(clients, seeded, method, path, operation):
    response = send(clients["admin"], method, url(path, seeded), json.dumps({"zz_unknown": 1}))
    assert_error_shape(response, allowed={400})
    assert "zz_unknown" in {item["field"] for item in response.json()["errors"]}


@pytest.mark.parametrize(("method", "path", "operation"), QUERY_OPERATIONS,
                         ids=_ids(QUERY_OPERATIONS))
def test_it_answers_huge_integers_in_query_parameters(clients, seeded, method, path, operation):
    names = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query"]
    query = "&".join(f"{name}={HUGE}" for name in names)
    response = send(clients["admin"], method, f"{url(path, seeded)}?{query}", "{}")
    assert_error_shape(response)


@pytest.mark.parametrize(("method", "path", "operation"), ID_OPERATIONS, ids=_ids(ID_OPERATIONS))
class TestPathIds:
    def test_it_answers_a_huge_path_id_with_404(self, clients, seeded, method, path, operation):
        response = send(clients["admin"], method, url(path, seeded, id_value=HUGE), "{}")
        assert_error_shape(response, allowed={404})

    @pytest.mark.parametrize("bad_id", ["-1", "0", "1.5", "abc"])
    def test_it_answers_a_malformed_path_id_with_404(self, clients, seeded, method, path,
                                                     operation, bad_id):
        response = send(clients["admin"], method, url(path, seeded, id_value=bad_id), "{}")
        assert_error_shape(response, allowed={404})


# Digits other than ASCII ones name no row: int() reads "+7", "٧" (Arabic-Indic) and "７"
# (fullwidth) as 7, so a proxy routing ids by [0-9]+ would send them elsewhere than the service.
OTHER_DIGITS = {"plus": lambda n: f"+{n}",
                "arabic-indic": lambda n: "".join(chr(0x0660 + int(d)) for d in str(n)),
                "fullwidth": lambda n: "".join(chr(0xFF10 + int(d)) for d in str(n))}


@pytest.mark.parametrize("spelling", OTHER_DIGITS, ids=list(OTHER_DIGITS))
@pytest.mark.parametrize(("method", "path", "operation"), ID_OPERATIONS, ids=_ids(ID_OPERATIONS))
def test_an_existing_id_in_other_digits_is_a_404(clients, seeded, method, path, operation,
                                                  spelling):
    ident = OTHER_DIGITS[spelling](seeded.get(path.split("/")[3], 1))
    response = send(clients["admin"], method, url(path, seeded, id_value=ident), "{}")
    assert_error_shape(response, allowed={404})


@pytest.mark.parametrize(("method", "path", "operation"), OPERATIONS, ids=_ids(OPERATIONS))
def test_a_format_suffix_is_a_404_in_the_error_shape(clients, seeded, method, path, operation):
    """`runs/1/events.json` was a 500 on every custom action (an unexpected `format` argument):
    the API answers JSON only, and no route takes a suffix."""
    suffixed = url(path, seeded).removesuffix("/") + ".json"
    response = send(clients["admin"], method, suffixed, "{}")
    if response.status_code == 301:  # a name may hold a dot: "viewer.json/" is then tried
        assert response["Location"] == suffixed + "/"
        response = send(clients["admin"], method, response["Location"], "{}")
    assert response.status_code == 404, response.content[:300]
    assert response.json()["error"] == "not_found"


@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_an_address_nothing_answers_under_api_is_a_json_404_in_every_mode(clients, settings,
                                                                          debug):
    settings.DEBUG = debug
    for path in ("/api/v1/nothing/", "/api/v1/runs/1/events.json", "/api/v2/runs/"):
        response = clients["admin"].get(path)
        assert response.status_code == 404, path
        assert response.json()["error"] == "not_found", path


@pytest.mark.parametrize("debug", [False, True], ids=["production", "debug"])
def test_a_failing_api_view_is_a_json_500_that_shows_nothing_internal(clients, seeded, settings,
                                                                      monkeypatch, caplog, debug):
    from api import views

    def fail(self, request, pk=None):
        raise RuntimeError("lost postgres://ascent:hunter2@db:5432/ascent")

    settings.DEBUG = debug
    monkeypatch.setattr(views.RunViewSet, "events", fail)
    response = clients["admin"].get(f"/api/v1/runs/{seeded['runs']}/events/")
    assert response.status_code == 500
    assert response.json()["error"] == "server_error"
    assert "hunter2" not in response.content.decode()
    assert "hunter2" in caplog.text  # the failure is in the service's log, with its trace


def test_error_reports_hide_the_stores_addresses(rf, settings):
    """The DEBUG error page and admin mails list settings and, under runserver, the environment:
    addresses of the database, broker and MLflow carry credentials."""
    from django.utils.module_loading import import_string

    settings.MLFLOW_TRACKING_URI = "http://ascent:hunter2@mlflow:5000"
    settings.CELERY_BROKER_URL = "redis://:hunter2@redis:6379/1"
    request = rf.get("/")
    request.META["DATABASE_URL"] = "postgres://ascent:hunter2@db:5432/ascent"
    reporter = import_string(settings.DEFAULT_EXCEPTION_REPORTER_FILTER)()
    shown = {**reporter.get_safe_settings(), **reporter.get_safe_request_meta(request)}
    for name in ("MLFLOW_TRACKING_URI", "CELERY_BROKER_URL", "DATABASE_URL"):
        assert shown[name] == reporter.cleansed_substitute, name
    assert "hunter2" not in repr(shown)


@pytest.mark.parametrize("against", ["²", "٣", "+1", "1" * 25, "0", ""])
def test_a_reference_run_that_is_no_id_is_refused_naming_against(clients, seeded, against):
    response = clients["admin"].get(f"/api/v1/runs/{seeded['runs']}/precision/",
                                    {"against": against})
    assert_error_shape(response, allowed={400})
    assert [e["field"] for e in response.json()["errors"]] == ["against"]


def test_it_names_each_huge_filter_parameter(clients, seeded):
    for path, name in (("/api/v1/runs/", "experiment"), ("/api/v1/runs/", "project"),
                       ("/api/v1/experiments/", "project")):
        response = clients["admin"].get(path, {name: str(HUGE)})
        assert response.status_code == 400, (path, name, response.content[:300])
        errors = response.json()["errors"]
        assert [e["field"] for e in errors] == [name], errors
        assert "64-bit" in errors[0]["message"], errors


# --- how the body is framed: chunked bodies under WSGI and ASGI --------------------------------

def test_it_answers_a_chunked_body_without_content_length_with_411(clients, seeded):
    response = clients["admin"].generic("POST", "/api/v1/runs/validate/", b'{"spec": {}}',
                                        content_type="application/json", CONTENT_LENGTH="",
                                        HTTP_TRANSFER_ENCODING="chunked")
    assert response.status_code == 411, response.content
    assert response.json()["error"] == "length_required"
    assert "Content-Length" in response.json()["detail"]


def test_it_answers_a_non_numeric_content_length_with_400(clients, seeded):
    response = clients["admin"].generic("POST", "/api/v1/runs/validate/", b"{}",
                                        content_type="application/json", CONTENT_LENGTH="12abc")
    assert response.status_code == 400
    assert response.json()["errors"] == [{"field": "Content-Length",
                                          "message": "Content-Length is not a number of bytes."}]


def asgi_post(path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> tuple[int, dict]:
    """POST `chunks` as one chunked body (no content-length) through the ASGI application."""
    import asyncio

    from ascent.asgi import application

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                         (b"transfer-encoding", b"chunked"), *headers],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                for i, c in enumerate(chunks)]
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # the client stays connected until the response is sent

    async def send(message):
        sent.append(message)

    asyncio.run(application(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body)


def test_under_asgi_a_chunked_body_is_read_whole(transactional_db, users):
    from accounts.models import ApiToken

    _, raw = ApiToken.issue(users["admin"], "asgi")
    status, body = asgi_post("/api/v1/runs/validate/", [b'{"spec": {"algorithm": "grpo"},', b' "prority": 5}'],
                             [(b"authorization", f"Bearer {raw}".encode())])
    assert status == 400, body  # the view saw both chunks: it names the unknown key
    assert [e["field"] for e in body["errors"]] == ["prority"], body


def test_under_asgi_a_chunked_body_over_the_limit_is_a_413(db, settings):
    settings.ASCENT_MAX_BODY_BYTES = 2048
    status, body = asgi_post("/api/v1/runs/validate/", [b'{"spec": "', b"x" * 4096, b'"}'], [])
    assert status == 413, body
    assert body["error"] == "payload_too_large" and "4108 bytes" in body["detail"]


def test_it_names_an_unknown_key_with_the_closest_known_one(clients, seeded, tiny_spec):
    response = clients["owner"].post("/api/v1/runs/", {"experiment": seeded["experiments"],
                                                       "spec": tiny_spec, "prority": 5}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == [{"field": "prority",
                                          "message": "Unknown key: did you mean 'priority'?"}]


def test_it_refuses_read_only_keys(clients, seeded):
    response = clients["owner"].patch(f"/api/v1/experiments/{seeded['experiments']}/",
                                      {"description": "d", "created_at": "2020-01-01T00:00:00Z"},
                                      format="json")
    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["field"] == "created_at"
    assert "Read-only" in response.json()["errors"][0]["message"]


@pytest.mark.parametrize(("path", "name"), [("/api/v1/runs/", "experiment"), ("/api/v1/runs/", "project"),
                                            ("/api/v1/experiments/", "project")])
def test_an_invisible_id_filters_like_a_nonexistent_one(clients, seeded, path, name):
    theirs = seeded["experiments"] if name == "experiment" else seeded["projects"]
    invisible = clients["stranger"].get(path, {name: theirs})
    missing = clients["stranger"].get(path, {name: theirs + 1000})
    assert (invisible.status_code, missing.status_code) == (200, 200)
    assert invisible.json()["results"] == missing.json()["results"] == []
