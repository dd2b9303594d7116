"""The OpenAPI document is valid and describes the API; Swagger UI serves it."""

from __future__ import annotations

import yaml
from openapi_spec_validator import validate


def test_the_openapi_document_validates(clients):
    response = clients["viewer"].get("/api/schema/")
    assert response.status_code == 200
    document = yaml.safe_load(response.content)
    validate(document)
    paths = document["paths"]
    for path in ("/api/v1/runs/", "/api/v1/runs/validate/", "/api/v1/runs/{id}/cancel/",
                 "/api/v1/runs/{id}/clone/", "/api/v1/runs/{id}/events/", "/api/v1/clusters/",
                 "/api/v1/nodes/{id}/drain/", "/api/v1/projects/{id}/members/", "/api/v1/tokens/",
                 "/api/v1/spec/schema/", "/api/v1/experiments/"):
        assert path in paths, path
    submit = paths["/api/v1/runs/"]["post"]
    assert {"201", "400", "403"} <= set(submit["responses"])
    scheme = document["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert {"bearerAuth": []} in submit["security"]


def test_swagger_ui_is_served_without_a_network(clients):
    response = clients["viewer"].get("/api/docs/")
    assert response.status_code == 200
    assert b"swagger-ui" in response.content
    assert b"cdn." not in response.content  # assets come from the sidecar package


def test_schema_generation_has_no_warnings(tmp_path, db):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "s.yaml"))
    assert "/api/v1/runs/" in (tmp_path / "s.yaml").read_text()


def _document(clients) -> dict:
    return yaml.safe_load(clients["viewer"].get("/api/schema/").content)


def test_every_operation_documents_its_error_responses(clients):
    for path, item in _document(clients)["paths"].items():
        for method, operation in item.items():
            codes = set(operation["responses"])
            where = {p["in"] for p in operation.get("parameters", [])}
            assert {"401", "429"} <= codes, (method, path, codes)
            if method in ("post", "put", "patch"):
                assert {"400", "403", "411", "413", "415"} <= codes, (method, path, codes)
            if "path" in where:
                assert "404" in codes, (method, path, codes)
            if "query" in where:
                assert "400" in codes, (method, path, codes)
            if method == "delete":
                assert "409" in codes, (method, path, codes)
            error = operation["responses"]["429"]
            assert error["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
            assert "Retry-After" in error["headers"]


def test_request_bodies_are_closed_and_read_only_fields_marked(clients):
    schemas = _document(clients)["components"]["schemas"]
    for name in ("RunSubmitRequest", "RunValidateRequest", "ExperimentRequest", "PatchedNodeRequest",
                 "ClusterRequest", "CloneRequest", "TokenRequest"):
        assert schemas[name]["additionalProperties"] is False, name
    run = schemas["Run"]["properties"]
    assert run["cluster"] == {"type": "string", "readOnly": True, "nullable": True}
    assert run["created_by"]["nullable"] is True
    assert schemas["Experiment"]["properties"]["run_count"]["readOnly"] is True
    assert "run_count" in schemas["Experiment"]["required"]


def test_the_log_stream_and_the_bare_objects_are_described(clients):
    paths = _document(clients)["paths"]
    logs = paths["/api/v1/runs/{id}/logs/"]["get"]["responses"]["200"]["content"]
    stream = logs["text/event-stream"]["schema"]
    assert stream["type"] == "object" and stream["required"] == ["event", "data"]  # each event
    assert stream["properties"]["event"]["enum"] == ["log", "end"]
    assert all(word in stream["description"] for word in ("`event: log`", "`event: end`", "keep-alive"))
    me = paths["/api/v1/me/"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert me == {"$ref": "#/components/schemas/Me"}
    presets = paths["/api/v1/spec/presets/"]["get"]["responses"]["200"]["content"]["application/json"]
    assert presets["schema"] == {"$ref": "#/components/schemas/SpecPresets"}
    schema = paths["/api/v1/spec/schema/"]["get"]["responses"]["200"]
    assert "JSON Schema" in schema["description"]


def test_utilisation_documents_the_counted_runs_of_other_projects(clients):
    schemas = _document(clients)["components"]["schemas"]
    assert "other_runs" in schemas["Utilisation"]["required"]
    assert set(schemas["OtherRuns"]["properties"]) == {"count", "device_count"}
