"""`resources.memory_gb`: each rank's bundle holds its device's share of the node's memory (Ray's
`memory` resource, in bytes), colocated roles split it, and a Ray cluster with too little memory
refuses the run naming the field."""

from __future__ import annotations

import pytest

from rl_core.errors import InputError
from rl_core.roles.cluster import GIB, bundle_resources, check_resources, role_share
from rl_core.spec import resolve_spec


def spec_with(**resources):
    """A GRPO spec with these resources; 24 prompts a step split over 1, 2, 3, 4 or 8 ranks."""
    return resolve_spec({"data": {"synthetic": {"task": "addition"}, "train_batch_size": 24},
                         "actor": {"ppo_mini_batch_size": 24}, "resources": resources})


def test_without_memory_gb_a_bundle_asks_for_no_memory():
    assert bundle_resources(spec_with(devices_per_node=2, cpus_per_device=3)) == {"CPU": 3}


def test_a_bundle_holds_the_nodes_memory_divided_by_its_devices():
    # 6 GiB per node over 4 devices: 1.5 GiB = 1_610_612_736 bytes per rank
    bundle = bundle_resources(spec_with(devices_per_node=4, memory_gb=6))
    assert bundle == {"CPU": 1, "memory": 1_610_612_736}
    assert bundle["memory"] * 4 == 6 * GIB


def test_an_accelerator_bundle_keeps_its_device_next_to_the_memory():
    bundle = bundle_resources(spec_with(device_type="npu", devices_per_node=8, cpus_per_device=4,
                                        memory_gb=512))
    assert bundle == {"NPU": 1, "CPU": 4, "memory": 64 * GIB}


def test_an_uneven_share_is_rounded_down_to_whole_bytes():
    # 1 GiB over 3 devices: 1_073_741_824 / 3 = 357_913_941.33 -> 357_913_941
    bundle = bundle_resources(spec_with(devices_per_node=3, memory_gb=1))
    assert bundle["memory"] == 357_913_941
    assert isinstance(bundle["memory"], int) and bundle["memory"] * 3 <= GIB


def test_colocated_roles_split_the_bundle_and_the_shares_fit_it():
    bundle = {"GPU": 1, "CPU": 4, "memory": 10}
    # three roles (actor, reference, critic): 10 bytes // 3 = 3 each, 9 <= 10
    assert role_share(bundle, 3) == {"num_cpus": 4 / 3, "num_gpus": 1 / 3, "memory": 3}
    assert role_share(bundle, 1) == {"num_cpus": 4, "num_gpus": 1, "memory": 10}


def test_an_npu_share_goes_to_custom_resources_and_memory_to_its_own_option():
    share = role_share({"NPU": 1, "CPU": 2, "memory": 8 * GIB}, 2)
    assert share == {"num_cpus": 1, "resources": {"NPU": 0.5}, "memory": 4 * GIB}


def test_without_memory_a_share_has_no_memory_option():
    assert role_share({"CPU": 2}, 2) == {"num_cpus": 1}


def test_a_cluster_with_enough_memory_is_accepted():
    # 2 nodes x 2 devices x 1 GiB per device (2 GiB per node): 4 GiB in all
    spec = spec_with(num_nodes=2, devices_per_node=2, memory_gb=2)
    check_resources(spec, {"CPU": 4, "memory": 4 * GIB})


def test_a_cluster_short_of_memory_is_refused_naming_the_field_and_what_it_has():
    spec = spec_with(num_nodes=2, devices_per_node=2, memory_gb=2)
    with pytest.raises(InputError) as caught:
        check_resources(spec, {"CPU": 64, "memory": 3.5 * GIB})
    message = str(caught.value)
    assert message.startswith("resources.memory_gb: the run asks for 2 GiB of host memory per "
                              "node x 2 node(s) (4.00 GiB) but the Ray cluster has 3.50 GiB")
    assert "lower resources.memory_gb" in message


def test_one_byte_short_is_short():
    spec = spec_with(devices_per_node=2, memory_gb=2)
    with pytest.raises(InputError, match="resources.memory_gb"):
        check_resources(spec, {"CPU": 2, "memory": 2 * GIB - 1})


def test_a_cluster_without_a_memory_resource_is_refused():
    with pytest.raises(InputError, match=r"resources.memory_gb: .* has 0.00 GiB of memory"):
        check_resources(spec_with(memory_gb=1), {"CPU": 8})


def test_without_memory_gb_the_clusters_memory_is_not_looked_at():
    check_resources(spec_with(devices_per_node=2), {"CPU": 2})


def test_devices_and_memory_short_together_are_both_named():
    spec = spec_with(device_type="gpu", devices_per_node=2, memory_gb=8)
    with pytest.raises(InputError) as caught:
        check_resources(spec, {"CPU": 8, "GPU": 1, "memory": GIB})
    message = str(caught.value)
    assert "asks for GPU 2, CPU 2 (1 node(s) x 2 gpu device(s)" in message
    assert "resources.memory_gb: the run asks for 8 GiB" in message
    assert "the Ray cluster has 1.00 GiB of memory" in message
