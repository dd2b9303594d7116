"""The memory plan at submit time: the dry run shows it for the chosen cluster's devices, a run
that cannot fit is refused unless the request says to ignore the plan, and a model whose shape
is unknown here gets no plan and no refusal."""

from __future__ import annotations

import pytest
import yaml

from clusters.models import Cluster, Node
from experiments.models import Run
from rl_core.memory_plan import GIB

pytestmark = pytest.mark.django_db


def big_spec(strategy: str = "torch", device_type: str = "npu",
             path: str = "/models/Qwen2.5-7B-Instruct", master_weights: bool = True,
             engine: str | None = "native") -> dict:
    """A 7B GRPO spec on 8 devices: the plain engine with the native rollout needs about 85 GiB
    per device in pure bfloat16, more with float32 master weights (the default). `engine`
    None leaves `rollout.engine` at its default (auto: planned as vLLM on gpu and npu)."""
    rollout = {"n_samples_per_prompt": 8, **({"engine": engine} if engine else {})}
    return {"algorithm": "grpo", "model": {"path": path, "dtype": "bfloat16"},
            "actor": {"strategy": strategy, "master_weights": master_weights},
            "resources": {"device_type": device_type, "devices_per_node": 8},
            "data": {"synthetic": {"task": "addition"}, "train_batch_size": 16},
            "rollout": rollout}


def gpu_cluster(name: str, model: str) -> Cluster:
    cluster = Cluster.objects.create(name=name, device_type="gpu",
                                     ray_address=f"http://{name}:8265")
    Node.objects.create(cluster=cluster, hostname=f"{name}-1", device_type=model, device_count=8,
                        healthy_device_count=8)
    return cluster


def validate(client, spec: dict, **extra):
    return client.post("/api/v1/runs/validate/", {"spec": spec, **extra}, format="json")


def messages_of(response) -> dict[str, str]:
    return {e["field"]: e["message"] for e in response.json()["errors"]}


def test_it_shows_the_plan_for_the_pinned_clusters_devices(clients, cluster):
    response = validate(clients["viewer"], big_spec(), cluster="npu-a")
    assert response.status_code == 200, response.json()
    body = response.json()
    plan = body["memory_plan"]
    assert body["memory_plan_reason"] == ""
    assert plan["device_model"] == "ascend-910b" and plan["device_cluster"] == "npu-a"
    assert plan["device_memory_bytes"] == 64 * GIB and plan["fits"] is False
    assert plan["message"].startswith("does not fit") and "actor.strategy=fsdp2" in plan["message"]
    assert plan["alternatives"][0]["change"] == "actor.strategy=fsdp2"
    assert plan["total_bytes"] == plan["phases"][plan["peak_phase"]]
    assert {c["role"] for c in plan["components"]} == {"actor", "reference"}


def test_a_tiny_model_fits(clients, cluster, tiny_spec):
    body = validate(clients["viewer"], {**tiny_spec, "resources": {"device_type": "npu"}}).json()
    assert body["memory_plan"]["fits"] is True
    assert body["memory_plan"]["message"].startswith("fits: ")


def test_a_cpu_run_has_a_plan_without_a_verdict(clients, tiny_spec):
    body = validate(clients["viewer"], tiny_spec).json()
    assert body["memory_plan"]["fits"] is None and body["memory_plan"]["device_model"] is None
    assert "device memory unknown" in body["memory_plan"]["message"]


def test_an_unknown_model_has_no_plan_and_a_reason(clients, cluster):
    response = validate(clients["viewer"], big_spec(path="/models/my-finetune"), cluster="npu-a")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["memory_plan"] is None
    assert body["memory_plan_reason"].startswith("no memory plan: model.path: cannot read")


def test_unpinned_it_plans_on_the_largest_device_of_any_cluster_of_the_kind(clients):
    gpu_cluster("gpu-h100", "nvidia-h100")
    gpu_cluster("gpu-h200", "nvidia-h200")
    spec = big_spec(device_type="gpu", master_weights=False)
    plan = validate(clients["viewer"], spec).json()["memory_plan"]
    assert (plan["device_model"], plan["device_cluster"]) == ("nvidia-h200", "gpu-h200")
    assert plan["fits"] is True


def test_vllms_cache_is_what_it_takes_of_the_device_it_would_get(clients):
    gpu_cluster("gpu-h100", "nvidia-h100")
    spec = big_spec(device_type="gpu", engine="vllm")
    plan = validate(clients["viewer"], spec).json()["memory_plan"]
    cache = {c["name"]: c["bytes"] for c in plan["components"]}["vLLM KV cache"]
    weights = {c["name"]: c["bytes"] for c in plan["components"]}["vLLM weights"]
    # rollout.gpu_memory_utilization (0.5) of the H100's 80 GiB, less vLLM's own weights: the
    # same figure `python -m rl_core plan --device-memory-gb 80` prints
    assert cache == int(0.5 * 80 * GIB) - weights


@pytest.mark.parametrize("device_type", ["gpu", "npu"])
def test_the_default_engine_is_planned_as_vllm_on_accelerators(clients, device_type):
    gpu_cluster("gpu-h100", "nvidia-h100")
    auto, vllm = (validate(clients["viewer"], big_spec(device_type=device_type, engine=engine))
                  .json()["memory_plan"] for engine in (None, "vllm"))
    assert (auto["setup"].pop("engine_auto"), vllm["setup"].pop("engine_auto")) == (True, False)
    assert auto == vllm  # neither fits: auto keeps vLLM's plan
    assert "vLLM KV cache" in {c["name"] for c in auto["components"]}


def test_without_registered_devices_an_npu_counts_as_a_910b(clients):
    plan = validate(clients["viewer"], big_spec()).json()["memory_plan"]
    assert plan["device_model"] == "ascend-910b" and plan["device_cluster"] is None
    assert plan["fits"] is False


def test_a_run_that_does_not_fit_the_pinned_cluster_is_refused_naming_the_change(submit, cluster):
    response = submit(spec=big_spec(), cluster="npu-a")
    assert response.status_code == 400, response.json()
    message = messages_of(response)["spec"]
    assert message.startswith("memory plan: does not fit")
    assert "actor.strategy=fsdp2" in message and "ignore_memory_plan" in message
    assert not Run.objects.exists()


def test_ignore_memory_plan_submits_it_anyway(submit, cluster):
    response = submit(spec=big_spec(), cluster="npu-a", ignore_memory_plan=True)
    assert response.status_code == 201, response.json()
    assert Run.objects.get().cluster == cluster


def test_the_suggested_change_is_accepted(submit, cluster):
    assert submit(spec=big_spec("fsdp2"), cluster="npu-a").status_code == 201


def test_unpinned_it_is_refused_only_when_no_cluster_of_the_kind_could_fit(submit):
    gpu_cluster("gpu-h100", "nvidia-h100")
    spec = big_spec(device_type="gpu", master_weights=False)
    pinned = submit(spec=spec, cluster="gpu-h100")
    assert pinned.status_code == 400 and "80.0 GiB per GPU" in messages_of(pinned)["spec"]
    assert submit(spec=spec).status_code == 400
    gpu_cluster("gpu-h200", "nvidia-h200")
    assert submit(spec=spec).status_code == 201


def test_an_unknown_model_is_not_refused(submit, cluster):
    assert submit(spec=big_spec(path="/models/my-finetune"), cluster="npu-a").status_code == 201


def test_ignore_memory_plan_must_be_a_boolean(submit, cluster):
    response = submit(ignore_memory_plan="sometimes")
    assert response.status_code == 400 and "ignore_memory_plan" in messages_of(response)


def test_a_clone_is_planned_too_and_may_ignore_the_plan(clients, submit, cluster):
    run_id = submit(spec=big_spec(), cluster="npu-a", ignore_memory_plan=True).json()["id"]
    url = f"/api/v1/runs/{run_id}/clone/"
    refused = clients["owner"].post(url, {}, format="json")
    assert refused.status_code == 400 and "actor.strategy=fsdp2" in messages_of(refused)["spec"]
    fixed = clients["owner"].post(url, {"overrides": ["actor.strategy=fsdp2"]}, format="json")
    assert fixed.status_code == 201, fixed.json()
    anyway = clients["owner"].post(url, {"ignore_memory_plan": True}, format="json")
    assert anyway.status_code == 201


@pytest.mark.parametrize(("persona", "status"), [("viewer", 403), ("stranger", 400),
                                                 ("anonymous", 401)])
def test_ignoring_the_plan_does_not_change_who_may_submit(submit, cluster, persona, status):
    response = submit(as_=persona, spec=big_spec(), cluster="npu-a", ignore_memory_plan=True)
    assert response.status_code == status and not Run.objects.exists()


def test_the_validate_schema_documents_the_plan(clients):
    schema = yaml.safe_load(clients["viewer"].get("/api/schema/").content)
    result = schema["components"]["schemas"]["ValidationResult"]["properties"]
    assert {"memory_plan", "memory_plan_reason"} <= set(result)
    submit_fields = schema["components"]["schemas"]["RunSubmitRequest"]["properties"]
    assert submit_fields["ignore_memory_plan"]["type"] == "boolean"
