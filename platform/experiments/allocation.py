"""Projects' device quotas and fair-share weights: what the scheduler is given, what a project's
page shows, and how platform administrators change them.

A quota caps the devices of one kind that a project's active runs (attempts not ended) may hold
at once; a weight sets the project's share when projects compete for devices (placement.py,
"Quotas and fair share"). Both apply to admissions only: lowering a quota never stops a run.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.db import transaction
from django.db.models import Count, Sum

from accounts.models import SHARE_WEIGHT_DEFAULT, Project
from clusters.choices import ClusterStatus, DeviceKind
from clusters.models import Cluster
from clusters.services import cluster_capacity
from experiments.choices import RunState
from experiments.models import Attempt, DeviceQuota, Run

Devices = dict[str, dict[str, int]]  # project name -> device kind -> devices


def held_by_project(projects: list[int] | None = None) -> Devices:
    """Devices held now by each project's active attempts, by kind."""
    attempts = Attempt.objects.filter(ended_at__isnull=True)
    if projects is not None:
        attempts = attempts.filter(run__experiment__project__in=projects)
    rows = (attempts.values("run__experiment__project__name", "run__device_type")
            .annotate(n=Sum("device_count")))
    held: Devices = {}
    for row in rows:
        held.setdefault(row["run__experiment__project__name"], {})[row["run__device_type"]] = (
            row["n"] or 0)
    return held


def quotas_by_project(projects: list[int] | None = None) -> Devices:
    rows = DeviceQuota.objects.all()
    if projects is not None:
        rows = rows.filter(project__in=projects)
    quotas: Devices = {}
    for name, kind, devices in rows.values_list("project__name", "device_type", "devices"):
        quotas.setdefault(name, {})[kind] = devices
    return quotas


def scheduling_inputs(project_names: set[str]) -> tuple[Devices, Devices, dict[str, float]]:
    """(quotas, usage, weights) of the named projects, as `placement.place` takes them."""
    projects = list(Project.objects.filter(name__in=project_names).values_list("pk", "name",
                                                                                 "share_weight"))
    ids = [pk for pk, _, _ in projects]
    weights = {name: weight for _, name, weight in projects if weight != SHARE_WEIGHT_DEFAULT}
    return quotas_by_project(ids), held_by_project(ids), weights


def healthy_devices() -> dict[str, int]:
    """Healthy devices of each kind on ready nodes of clusters that are not offline: the whole
    from which dominant shares are taken."""
    total: dict[str, int] = {}
    for cluster in Cluster.objects.exclude(status=ClusterStatus.OFFLINE):
        for kind, capacity in cluster_capacity(cluster).items():
            total[kind] = total.get(kind, 0) + capacity.healthy
    return total


def dominant_share(held: Mapping[str, int], capacity: Mapping[str, int], weight: float) -> float:
    """max over kinds of held / healthy, divided by the weight (placement.py's measure)."""
    fractions = (n / capacity[k] for k, n in held.items() if capacity.get(k))
    return max(fractions, default=0.0) / weight


def allocation(project: Project, capacity: Mapping[str, int] | None = None) -> dict:
    """A project's weight, quotas, the devices it holds, its dominant share and why its queued
    runs wait (counts by cause)."""
    capacity = healthy_devices() if capacity is None else capacity
    held = held_by_project([project.pk]).get(project.name, {})
    waiting = dict(Run.objects.filter(experiment__project=project, state=RunState.QUEUED)
                   .exclude(waiting_cause="").values_list("waiting_cause")
                   .annotate(n=Count("id")).order_by())
    return {
        "share_weight": project.share_weight,
        "quotas": quotas_by_project([project.pk]).get(project.name, {}),
        "held": held,
        "healthy": dict(capacity),
        "dominant_share": dominant_share(held, capacity, project.share_weight),
        "waiting": waiting,
    }


@transaction.atomic
def set_allocation(project: Project, *, share_weight: float | None = None,
                   quotas: Mapping[str, int | None] | None = None, replace: bool = False) -> None:
    """Change a project's weight and quotas (values checked by the caller). quotas: kind ->
    devices, or None to remove that kind's quota; `replace`: kinds not named lose theirs."""
    if share_weight is not None:
        Project.objects.filter(pk=project.pk).update(share_weight=share_weight)
        project.share_weight = share_weight
    if quotas is None:
        return
    unknown = set(quotas) - set(DeviceKind.values)
    if unknown:
        raise ValueError(f"unknown device kinds {sorted(unknown)}")
    if replace:
        DeviceQuota.objects.filter(project=project).exclude(device_type__in=[
            kind for kind, devices in quotas.items() if devices is not None]).delete()
    for kind, devices in quotas.items():
        if devices is None:
            DeviceQuota.objects.filter(project=project, device_type=kind).delete()
        else:
            DeviceQuota.objects.update_or_create(project=project, device_type=kind,
                                                 defaults={"devices": devices})
