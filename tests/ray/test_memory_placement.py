"""`resources.memory_gb` on a real local Ray: the check reads the cluster's real `memory`, the
bundles reserve it, and colocated role actors with their shares start inside one bundle."""

from __future__ import annotations

import pytest

from rl_core.errors import InputError
from rl_core.roles.cluster import GIB, bundle_resources, check_resources, role_share
from rl_core.spec import resolve_spec

ray = pytest.importorskip("ray")
placement = pytest.importorskip("ray.util.placement_group")
strategies = pytest.importorskip("ray.util.scheduling_strategies")


def spec_with(memory_gb: float):
    return resolve_spec({"data": {"synthetic": {"task": "addition"}},
                         "resources": {"devices_per_node": 2, "memory_gb": memory_gb}})


def in_bundle(group, rank: int):
    return strategies.PlacementGroupSchedulingStrategy(placement_group=group,
                                                       placement_group_bundle_index=rank)


@ray.remote
class Role:
    def ping(self) -> bool:
        return True


def test_a_request_beyond_the_clusters_memory_is_refused_before_placement(local_ray):
    have = ray.cluster_resources()
    assert have.get("memory", 0) > 0, "Ray reports the node's memory"
    too_much = have["memory"] / GIB + 1  # one GiB more than the whole cluster has, on one node
    with pytest.raises(InputError, match=r"^resources.memory_gb: the run asks for"):
        check_resources(spec_with(too_much), have)


def test_the_bundles_reserve_the_memory_and_two_colocated_roles_share_each(local_ray):
    spec = spec_with(0.25)  # 128 MiB per rank, 64 MiB per role
    check_resources(spec, ray.cluster_resources())
    bundle = bundle_resources(spec)
    group = placement.placement_group([dict(bundle)] * spec.world_size, strategy="STRICT_PACK")
    try:
        assert group.wait(60), "the placement group was not placed"
        reserved = placement.placement_group_table(group)["bundles"]
        assert [b["memory"] for b in reserved.values()] == [GIB // 8] * 2
        share = role_share(bundle, 2)
        assert share["memory"] == GIB // 16
        roles = [Role.options(**share, scheduling_strategy=in_bundle(group, rank)).remote()
                 for rank in range(spec.world_size) for _ in range(2)]
        assert ray.get([role.ping.remote() for role in roles], timeout=60) == [True] * 4
        for role in roles:
            ray.kill(role)
    finally:
        placement.remove_placement_group(group)
