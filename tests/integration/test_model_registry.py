"""The model registry end to end, with real processes: a run's checkpoint registered through the
API is exported and registered in MLflow by the Celery worker, with the run's lineage (its data
file's SHA-256); a second run starts from `models:/adder@champion` through Ray, and its own
version names the first as its parent; aliases move between versions here and in MLflow."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from mlflow.tracking import MlflowClient

import rl_core
from registry.models import ModelVersion
from tests.integration.test_dispatch import submit, world  # noqa: F401 - the fixture
from tests.stack import tiny_run, wait_state

pytestmark = pytest.mark.django_db(transaction=True)


def wait_version(client, version_id: int, worker, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = client.get(f"/api/v1/model-versions/{version_id}/").json()
        if shown["state"] != "pending":
            return shown
        time.sleep(0.5)
    raise AssertionError(f"version {version_id} still pending after {timeout} s\n"
                         f"{worker.log()[-4000:]}")


def test_a_registered_checkpoint_starts_a_run_and_each_version_shows_its_lineage(
        world, worker, mlflow_server, tmp_path):  # noqa: F811
    client, experiment = world
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a in range(6) for b in range(6)))
    spec = tiny_run(2)
    spec["data"] = {"train_files": [str(data)], "prompt_template": "plain", "train_batch_size": 4}
    first = submit(client, experiment, spec)
    assert wait_state(first, {"SUCCEEDED", "FAILED"}, 300, worker).state == "SUCCEEDED"

    asked = client.post("/api/v1/model-versions/", {
        "run": first, "name": "adder", "aliases": ["champion"], "description": "sums to 10",
        "tags": {"task": "addition"}}, format="json")
    assert asked.status_code == 202, asked.content
    assert asked.json()["state"] == "pending" and asked.json()["aliases"] == ["champion"]
    v1 = wait_version(client, asked.json()["id"], worker)
    assert v1["state"] == "ready", v1["error"]
    assert (v1["version"], v1["uri"], v1["step"], v1["aliases"]) == (1, "models:/adder/1", 2,
                                                                     ["champion"])
    assert v1["source"].endswith("/exported/step_2") and v1["parent"] is None
    lineage = v1["lineage"]
    assert lineage["data"]["files"] == [{
        "split": "train", "path": str(data), "bytes": data.stat().st_size,
        "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}]
    assert lineage["run"]["platform_run_id"] == first and lineage["code"]["rl_core"] == \
        rl_core.__version__ and lineage["spec"]["data"]["train_files"] == [str(data)]
    registry = MlflowClient(mlflow_server, registry_uri=mlflow_server)
    assert registry.get_model_version_by_alias("adder", "champion").version == "1"
    assert registry.get_model_version("adder", "1").tags["task"] == "addition"

    # A spec naming a version that does not exist is refused at submission, naming the field.
    refused = client.post("/api/v1/runs/", {"experiment": experiment.pk, "spec": {
        **tiny_run(1), "model": {"path": "models:/adder/7"}}}, format="json")
    assert refused.status_code == 400 and "adder has no ready version 7" in refused.content.decode()

    # A run starts from the alias, and its version names v1 as its parent.
    second = submit(client, experiment,
                    {**tiny_run(1), "model": {"path": "models:/adder@champion"}})
    run = wait_state(second, {"SUCCEEDED", "FAILED"}, 300, worker)
    assert run.state == "SUCCEEDED", run.error
    asked = client.post("/api/v1/model-versions/", {"run": second, "name": "adder"},
                        format="json")
    assert asked.status_code == 202, asked.content
    v2 = wait_version(client, asked.json()["id"], worker)
    assert v2["state"] == "ready" and v2["version"] == 2, v2["error"]
    assert v2["parent"] == {"id": v1["id"], "uri": "models:/adder/1", "run": first}
    assert v2["lineage"]["model"]["registered"]["uri"] == "models:/adder/1"

    # The run links to its version, the model lists both; the alias moves to v2 everywhere.
    assert [(v["name"], v["version"]) for v in
            client.get(f"/api/v1/runs/{first}/").json()["model_versions"]] == [("adder", 1)]
    moved = client.patch(f"/api/v1/model-versions/{v2['id']}/", {"aliases": ["champion"]},
                         format="json")
    assert moved.status_code == 200 and moved.json()["aliases"] == ["champion"], moved.content
    model = client.get(f"/api/v1/models/{v1['model']}/").json()
    assert model["aliases"] == {"champion": 2} and model["latest_version"] == 2
    assert [v["version"] for v in model["versions"]] == [2, 1]
    assert registry.get_model_version_by_alias("adder", "champion").version == "2"
    assert ModelVersion.objects.get(pk=v1["id"]).alias_names() == []
