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
