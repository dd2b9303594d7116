"""Clusters and their nodes; staff drain and undrain nodes (clusters.services, as the API does)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from clusters.choices import DeviceKind, NodeState
from clusters.models import Cluster, Node
from clusters.services import cluster_capacity, set_node_state

# What each node action sets, and its past tense for the message.
NODE_ACTIONS = {"drain": (NodeState.DRAINING, "drained"), "undrain": (NodeState.READY, "undrained")}


def capacity_rows(cluster: Cluster) -> list[dict]:
    """cluster_capacity as rows for bars: per kind, the share held by runs and the share out of
    service (on draining nodes, or unhealthy), as percentages of the devices installed."""
    rows = []
    capacity = cluster_capacity(cluster)
    for kind in sorted(capacity, key=lambda k: (k != cluster.device_type, k)):  # its own kind first
        cap = capacity[kind]
        unavailable = max(0, cap.total - cap.healthy)
        rows.append({
            "kind": kind, "label": DeviceKind(kind).label, "cap": cap, "unavailable": unavailable,
            "held_pct": _pct(cap.held, cap.total), "unavailable_pct": _pct(unavailable, cap.total),
        })
    return rows


def _pct(part: int, whole: int) -> int:
    return min(100, round(100 * part / whole)) if whole else 0


def policy_rows(cluster: Cluster) -> list[tuple[str, list[str]]]:
    """The path policy's allowed roots per kind of path, as (label, roots); empty: any path."""
    return [("Model roots", cluster.model_roots), ("Data roots", cluster.data_roots),
            ("Output roots", cluster.output_roots)]


def clusters_with_capacity():
    """Every cluster (all signed-in users may see them, as in the API) with its capacity rows
    and its path policy (read-only here: staff edit it in the admin or the API)."""
    clusters = list(Cluster.objects.prefetch_related("nodes"))
    for cluster in clusters:
        cluster.capacity_rows = capacity_rows(cluster)
        cluster.policy_rows = policy_rows(cluster)
    return clusters


@login_required
def cluster_list(request):
    return render(request, "frontend/clusters.html", {"clusters": clusters_with_capacity()})


@login_required
@require_POST
def node_action(request, pk, action):
    if action not in NODE_ACTIONS:
        raise Http404(f"There is no node action {action!r}; use drain or undrain.")
    node = get_object_or_404(Node, pk=pk)
    if not request.user.is_staff:
        messages.error(request, "Only platform administrators (staff) may drain or undrain nodes.")
        return redirect("frontend:clusters")
    state, done = NODE_ACTIONS[action]
    set_node_state(node, state)
    messages.success(request, f"Node {node.hostname} of {node.cluster.name} {done}: it is now "
                              f"{node.get_state_display().lower()}.")
    return redirect(f"{reverse('frontend:clusters')}#cluster-{node.cluster.name}")
