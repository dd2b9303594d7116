"""Capacity arithmetic, node actions and the clusters' path policies."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from django.db.models import Sum

from clusters.choices import DeviceKind, NodeState, kind_of
from clusters.models import Cluster, Node
from rl_core.admission import PathPolicy, check_paths


@dataclass(frozen=True)
class Capacity:
    """Devices of one kind on a cluster. `free` never goes below zero."""

    total: int  # installed on nodes that are not down
    healthy: int  # healthy on ready nodes: what can be scheduled
    held: int  # held by active attempts
    free: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def compute_capacity(nodes: list[tuple[str, str, int, int]], held: dict[str, int]) -> dict[str, Capacity]:
    """Pure capacity arithmetic.

    nodes: (device_type, state, device_count, healthy_device_count) per node.
    held: devices held by active attempts, by kind. Returns a Capacity for every kind present.
    """
    totals: dict[str, list[int]] = {}
    for device_type, state, count, healthy in nodes:
        kind = kind_of(device_type).value
        entry = totals.setdefault(kind, [0, 0])
        if state != NodeState.DOWN:
            entry[0] += count
        if state == NodeState.READY:
            entry[1] += healthy
    for kind in held:
        totals.setdefault(kind, [0, 0])
    return {
        kind: Capacity(total, healthy, held.get(kind, 0), max(0, healthy - held.get(kind, 0)))
        for kind, (total, healthy) in sorted(totals.items())
    }


def held_devices(cluster: Cluster) -> dict[str, int]:
    """Devices held on the cluster by attempts that have not ended, by kind (read through the
    reverse relation `cluster.attempts`: experiments depends on clusters, not the reverse)."""
    rows = (
        cluster.attempts.filter(ended_at__isnull=True)
        .values("run__device_type")
        .annotate(n=Sum("device_count"))
    )
    return {row["run__device_type"]: row["n"] or 0 for row in rows}


def cluster_capacity(cluster: Cluster) -> dict[str, Capacity]:
    nodes = list(
        cluster.nodes.values_list("device_type", "state", "device_count", "healthy_device_count")
    )
    return compute_capacity(nodes, held_devices(cluster))


def free_devices(cluster: Cluster, kind: DeviceKind | str) -> int:
    cap = cluster_capacity(cluster).get(str(kind))
    return cap.free if cap else 0


def set_node_state(node: Node, state: NodeState) -> Node:
    """Drain (no new attempts placed here), undrain (ready again) or mark down."""
    Node.objects.filter(pk=node.pk).update(state=state)
    node.refresh_from_db()
    return node


def fitting_clusters(device_request: dict, cluster: Cluster | None = None) -> list[dict]:
    """Clusters offering the requested device kind (or the one asked for), with their free
    devices now and whether the request fits at once (the dry run's answer)."""
    kind, count = device_request["device_type"], device_request["device_count"]
    clusters = [cluster] if cluster else Cluster.objects.all()
    result = []
    for candidate in clusters:
        capacity = cluster_capacity(candidate).get(kind)
        if capacity is not None or cluster is not None:
            free = capacity.free if capacity else 0
            result.append({"name": candidate.name, "free": free, "fits_now": free >= count})
    return result


def node_memory(kind: str, cluster: Cluster | None = None) -> list[tuple[int, str]]:
    """(memory_bytes, "cluster/hostname") of each ready node with healthy devices of `kind` that
    a run could be placed on: on `cluster`, or on any cluster offering the kind (any cluster for
    cpu). 0 bytes: the inventory does not know that node's memory."""
    if cluster is not None:
        clusters = [cluster]
    elif kind == DeviceKind.CPU:
        clusters = Cluster.objects.all()
    else:
        clusters = Cluster.objects.filter(device_type=kind)
    rows = Node.objects.filter(cluster__in=clusters, state=NodeState.READY,
                               healthy_device_count__gt=0).values_list(
        "device_type", "memory_bytes", "cluster__name", "hostname")
    return [(memory, f"{name}/{host}") for model, memory, name, host in rows
            if kind_of(model) == kind]


def clusters_allowing(spec_data, policies: list[PathPolicy]) -> frozenset[str] | None:
    """Names of the clusters whose path policy (`Cluster.path_policy()`) allows the spec; None
    when no policy restricts anything (every cluster allows it)."""
    if all(policy.unrestricted for policy in policies):
        return None
    return frozenset(p.cluster for p in policies if p.unrestricted or not check_paths(spec_data, p))
