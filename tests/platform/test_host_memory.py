"""`resources.memory_gb` at submit: a run asking for more host memory per node than any node it
could be placed on has is refused at the field; nodes whose memory the inventory does not know
refuse nothing."""

from __future__ import annotations

import pytest

from clusters.models import Cluster, Node
from experiments.models import Run
from rl_core.memory_plan import GIB

pytestmark = pytest.mark.django_db


def npu_spec(memory_gb: float | None) -> dict:
    return {"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}},
            "resources": {"device_type": "npu", "memory_gb": memory_gb}}


def add_node(cluster: Cluster, hostname: str, memory_gib: int, **extra) -> Node:
    fields = {"device_type": "ascend-910b", "device_count": 8, "healthy_device_count": 8,
              "memory_bytes": memory_gib * GIB, **extra}
    return Node.objects.create(cluster=cluster, hostname=hostname, **fields)


def messages_of(response) -> dict[str, str]:
    return {e["field"]: e["message"] for e in response.json()["errors"]}


@pytest.fixture
def npu_cluster(cluster) -> Cluster:
    """npu-a with two nodes of known memory instead of its own: 512 GiB (n2), 1024 GiB (n3)."""
    cluster.nodes.all().delete()
    add_node(cluster, "n2", 512)
    add_node(cluster, "n3", 1024)
    return cluster


def test_it_refuses_more_memory_than_the_largest_node_of_the_pinned_cluster(submit, npu_cluster):
    response = submit(spec=npu_spec(1500), cluster="npu-a")
    assert response.status_code == 400, response.json()
    message = messages_of(response)["spec.resources.memory_gb"]
    assert message.startswith("1500 GiB per node is more than any node of cluster npu-a has "
                              "(the largest, npu-a/n3, has 1024.0 GiB)")
    assert "set it to null" in message
    assert not Run.objects.exists()


def test_what_the_largest_node_has_is_accepted(submit, npu_cluster):
    response = submit(spec=npu_spec(1024), cluster="npu-a")
    assert response.status_code == 201, response.json()
    assert Run.objects.get().spec["resources"]["memory_gb"] == 1024


def test_the_dry_run_refuses_it_too(clients, npu_cluster):
    response = clients["viewer"].post("/api/v1/runs/validate/",
                                      {"spec": npu_spec(2048), "cluster": "npu-a"}, format="json")
    assert response.status_code == 400
    assert "spec.resources.memory_gb" in messages_of(response)


def test_unpinned_it_is_refused_only_when_no_cluster_of_the_kind_has_such_a_node(submit,
                                                                                 npu_cluster):
    assert submit(spec=npu_spec(2048)).status_code == 400
    big = Cluster.objects.create(name="npu-b", device_type="npu", ray_address="http://b:8265")
    add_node(big, "m1", 2048)
    assert submit(spec=npu_spec(2048)).status_code == 201


def test_nodes_that_cannot_take_runs_do_not_count(submit, npu_cluster):
    add_node(npu_cluster, "drained", 4096, state="draining")
    add_node(npu_cluster, "broken", 4096, healthy_device_count=0)
    add_node(npu_cluster, "gpu", 4096, device_type="nvidia-h100")
    assert submit(spec=npu_spec(2048), cluster="npu-a").status_code == 400


def test_a_node_without_a_memory_figure_refuses_nothing(submit, npu_cluster):
    add_node(npu_cluster, "unknown", 0)
    assert submit(spec=npu_spec(60_000), cluster="npu-a").status_code == 201


def test_without_memory_gb_nothing_is_checked(submit, npu_cluster):
    assert submit(spec=npu_spec(None), cluster="npu-a").status_code == 201


def test_a_cpu_run_is_judged_by_the_cpu_nodes(submit, tiny_spec):
    local = Cluster.objects.create(name="local", device_type="cpu", ray_address="http://l:8265")
    Node.objects.create(cluster=local, hostname="box", device_type="cpu", device_count=16,
                        healthy_device_count=16, memory_bytes=64 * GIB)
    spec = {**tiny_spec, "resources": {"memory_gb": 65}}
    response = submit(spec=spec)
    assert response.status_code == 400
    assert "any node with cpu devices has (the largest, local/box, has 64.0 GiB)" in (
        messages_of(response)["spec.resources.memory_gb"])
    assert submit(spec={**tiny_spec, "resources": {"memory_gb": 64}}).status_code == 201
