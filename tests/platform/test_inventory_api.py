"""Clusters and nodes: registration, validation, capacity in the API, drain and undrain."""

from __future__ import annotations

from clusters.models import Node


def test_a_cluster_shows_its_capacity_by_device_kind(clients, cluster):
    Node.objects.create(cluster=cluster, hostname="n2", device_type="ascend-910b", device_count=8,
                        healthy_device_count=8, state="draining")
    body = clients["viewer"].get(f"/api/v1/clusters/{cluster.pk}/").json()
    assert body["node_count"] == 2
    assert body["capacity"] == {"npu": {"total": 16, "healthy": 8, "held": 0, "free": 8}}


def test_drain_and_undrain_change_what_can_be_scheduled(clients, cluster):
    node = cluster.nodes.get()
    assert clients["admin"].post(f"/api/v1/nodes/{node.pk}/drain/").json()["state"] == "draining"
    assert clients["admin"].get(f"/api/v1/clusters/{cluster.pk}/").json()["capacity"]["npu"]["free"] == 0
    assert clients["admin"].post(f"/api/v1/nodes/{node.pk}/undrain/").json()["state"] == "ready"
    assert clients["admin"].get(f"/api/v1/clusters/{cluster.pk}/").json()["capacity"]["npu"]["free"] == 8


def test_node_input_is_checked(clients, cluster):
    bad = clients["admin"].post("/api/v1/nodes/", {
        "cluster": "npu-a", "hostname": "n3", "device_type": "ascend-999", "device_count": 4,
        "healthy_device_count": 5, "labels": ["not", "a", "dict"]}, format="json")
    assert bad.status_code == 400
    fields = {e["field"] for e in bad.json()["errors"]}
    assert {"device_type", "labels"} <= fields
    over = clients["admin"].post("/api/v1/nodes/", {
        "cluster": "npu-a", "hostname": "n3", "device_type": "ascend-910c", "device_count": 4,
        "healthy_device_count": 5}, format="json")
    assert over.status_code == 400
    assert over.json()["errors"] == [{"field": "healthy_device_count",
                                      "message": "5 healthy devices exceed device_count (4)."}]
    duplicate = clients["admin"].post("/api/v1/nodes/", {"cluster": "npu-a", "hostname": "n1"}, format="json")
    assert duplicate.status_code == 400
    assert not Node.objects.filter(hostname="n3").exists()


def test_nodes_filter_by_cluster_state_and_type(clients, cluster):
    Node.objects.create(cluster=cluster, hostname="g1", device_type="nvidia-h100", device_count=8,
                        healthy_device_count=8, state="down")
    names = lambda q: {n["hostname"] for n in clients["viewer"].get(f"/api/v1/nodes/?{q}").json()["results"]}  # noqa: E731
    assert names("cluster=npu-a") == {"n1", "g1"}
    assert names("state=down") == {"g1"}
    assert names("device_type=ascend-910b") == {"n1"}


def test_a_cluster_name_is_a_slug(clients):
    response = clients["admin"].post("/api/v1/clusters/", {"name": "Bad Name!", "ray_address": "x"},
                                     format="json")
    assert response.status_code == 400 and response.json()["errors"][0]["field"] == "name"


def test_a_cluster_with_runs_cannot_be_deleted(clients, cluster, submit):
    assert submit(cluster="npu-a").status_code == 201
    response = clients["admin"].delete(f"/api/v1/clusters/{cluster.pk}/")
    assert response.status_code == 409
    assert "runs" in response.json()["detail"]
