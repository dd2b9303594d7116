"""The API client (`ascent_client`, the `ascent` command) against the server's OpenAPI schema:
every call it makes is an operation of the schema with the parameters and body fields it sends;
and its Idempotency-Key from a pipeline's job survives the job's retries."""

from __future__ import annotations

import re

import pytest
import yaml

from ascent_client import ENDPOINTS, Client

# What the client sends with each call: query parameters, headers, body fields.
SENT = {
    "experiments": {"query": {"project"}},
    "submit": {"header": {"Idempotency-Key"},
               "body": {"experiment", "spec", "overrides", "name", "priority", "max_restarts",
                        "cluster"}},
    "logs": {"query": {"offset", "attempt"}},
    "metrics": {"query": {"keys", "max_points"}},
}


def test_every_call_of_the_client_is_an_operation_of_the_openapi_schema(clients):
    document = yaml.safe_load(clients["viewer"].get("/api/schema/").content)
    schemas = document["components"]["schemas"]
    for name, (method, path) in ENDPOINTS.items():
        assert path in document["paths"], (name, path)
        operation = document["paths"][path].get(method.lower())
        assert operation is not None, (name, method, path)
        sent = SENT.get(name, {})
        for where in ("query", "header"):
            known = {p["name"] for p in operation.get("parameters", []) if p["in"] == where}
            assert sent.get(where, set()) <= known, (name, where, sent.get(where), known)
        if "body" in sent:
            ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            fields = set(schemas[ref.rsplit("/", 1)[1]]["properties"])
            assert sent["body"] <= fields, (name, sent["body"] - fields)
        for placeholder in re.findall(r"{(\w+)}", path):
            assert any(p["name"] == placeholder and p["in"] == "path"
                       for p in operation.get("parameters", [])), (name, placeholder)


def test_a_pipelines_retry_finds_the_run_its_first_try_submitted():
    spec = {"algorithm": "grpo", "model": {"path": "tiny:nano"}}
    github = {"GITHUB_RUN_ID": "9001", "GITHUB_REPOSITORY": "team/models", "GITHUB_JOB": "train",
              "GITHUB_RUN_ATTEMPT": "1"}
    key = Client.pipeline_key(spec, ["trainer.total_steps=4"], "p/e", github)
    assert key and key.startswith("team/models/9001/train:") and len(key) <= 128
    retry = {**github, "GITHUB_RUN_ATTEMPT": "2"}  # a re-run of the same job
    assert Client.pipeline_key(spec, ["trainer.total_steps=4"], "p/e", retry) == key
    for other in ((spec, ["trainer.total_steps=5"], "p/e", github),  # another submission
                  (spec, ["trainer.total_steps=4"], "p/f", github),
                  (spec, ["trainer.total_steps=4"], "p/e", {**github, "GITHUB_RUN_ID": "9002"})):
        assert Client.pipeline_key(*other) != key
    airflow = {"AIRFLOW_CTX_DAG_ID": "rl", "AIRFLOW_CTX_DAG_RUN_ID": "manual__2026-12-06",
               "AIRFLOW_CTX_TASK_ID": "train"}
    assert Client.pipeline_key(spec, environ=airflow).startswith("rl/manual__2026-12-06/train:")
    assert Client.pipeline_key(spec, environ={}) is None  # a person at a terminal


@pytest.mark.parametrize("url,token,message", [
    ("", "asc_x", "no Ascent server: set ASCENT_URL"),
    ("ascent.example.org", "asc_x", "must start with http:// or https://"),
    ("http://127.0.0.1:1", "", "no API token: set ASCENT_TOKEN"),
])
def test_a_client_without_a_server_or_token_says_which(monkeypatch, url, token, message):
    monkeypatch.delenv("ASCENT_URL", raising=False)
    monkeypatch.delenv("ASCENT_TOKEN", raising=False)
    with pytest.raises(ValueError, match=message):
        Client(url, token)


def test_the_client_needs_only_requests_and_pyyaml():
    """A pipeline installs the client where neither Django nor torch is: it imports the standard
    library, requests and PyYAML, nothing of the platform or of rl_core."""
    import ast
    import sys
    from pathlib import Path

    import ascent_client

    allowed = {"requests", "yaml", "ascent_client", "__future__"}
    for file in Path(ascent_client.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in allowed, (file.name, name)
