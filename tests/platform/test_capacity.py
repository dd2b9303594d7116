"""Capacity: healthy devices on ready nodes minus those held by active attempts."""

from __future__ import annotations

from django.utils import timezone

from clusters.models import Cluster, Node
from clusters.services import Capacity, cluster_capacity, compute_capacity, free_devices
from experiments.models import Attempt, Run


def test_it_counts_only_healthy_devices_on_ready_nodes():
    nodes = [
        ("ascend-910b", "ready", 8, 7),     # one device unhealthy
        ("ascend-910b", "draining", 8, 8),  # installed, not schedulable
        ("ascend-910c", "down", 16, 0),     # not even counted as installed
        ("cpu", "ready", 64, 64),
    ]
    cap = compute_capacity(nodes, held={"npu": 3})
    # npu: total = 8 + 8 (down excluded) = 16; healthy = 7 (ready only); free = 7 - 3 = 4
    assert cap["npu"] == Capacity(total=16, healthy=7, held=3, free=4)
    assert cap["cpu"] == Capacity(total=64, healthy=64, held=0, free=64)


def test_free_never_goes_negative_when_nodes_disappear_under_running_attempts():
    assert compute_capacity([("nvidia-h100", "ready", 8, 2)], held={"gpu": 6})["gpu"].free == 0


def test_held_devices_without_nodes_still_show():
    assert compute_capacity([], held={"gpu": 2}) == {"gpu": Capacity(0, 0, 2, 0)}


def _run(experiment, cluster, devices: int, ended: bool, number: int) -> None:
    run = Run.objects.create(experiment=experiment, spec={}, algorithm="grpo", device_type="npu",
                             device_count=devices, state="RUNNING")
    Attempt.objects.create(run=run, number=number, cluster=cluster, device_count=devices,
                           ray_submission_id=Attempt.submission_id(run.pk, number),
                           ended_at=timezone.now() if ended else None)


def test_it_subtracts_devices_held_by_active_attempts(experiment, cluster):
    Node.objects.create(cluster=cluster, hostname="n2", device_type="ascend-910b", device_count=8,
                        healthy_device_count=6)
    _run(experiment, cluster, 4, ended=False, number=1)
    _run(experiment, cluster, 2, ended=False, number=1)
    _run(experiment, cluster, 8, ended=True, number=1)  # finished attempts hold nothing
    other = Cluster.objects.create(name="npu-b", device_type="npu", ray_address="http://b:8265")
    _run(experiment, other, 5, ended=False, number=1)  # held elsewhere
    # healthy: 8 (n1) + 6 (n2) = 14; held: 4 + 2 = 6; free: 8
    assert cluster_capacity(cluster)["npu"] == Capacity(total=16, healthy=14, held=6, free=8)
    assert free_devices(cluster, "npu") == 8
    assert free_devices(cluster, "gpu") == 0
