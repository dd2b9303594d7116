"""`parallel.colocate_actor_rollout: false`: the spec's rollout pool takes the run's last
`parallel.rollout_devices` devices and the others train; layouts it cannot take are refused
naming the field."""

from __future__ import annotations

import pytest

from rl_core.spec import SpecError, resolve_spec


def spec(devices: int = 4, **parallel) -> dict:
    return {"data": {"synthetic": {"task": "addition"}, "train_batch_size": 6},
            "model": {"path": "tiny:nano"}, "resources": {"devices_per_node": devices},
            "actor": {"ppo_mini_batch_size": 6}, "parallel": parallel,
            "trainer": {"logger": []}}


def test_the_pool_takes_the_last_devices_and_the_rest_train():
    pooled = resolve_spec(spec(colocate_actor_rollout=False, rollout_devices=1))
    assert (pooled.world_size, pooled.training_devices, pooled.data_parallel_size) == (4, 3, 3)
    assert pooled.device_request()["device_count"] == 4  # the scheduler finds every device
    colocated = resolve_spec(spec(4, **{}) | {"data": {"synthetic": {"task": "addition"},
                                                       "train_batch_size": 8},
                                               "actor": {"ppo_mini_batch_size": 8}})
    assert (colocated.training_devices, colocated.data_parallel_size) == (4, 4)


@pytest.mark.parametrize(("parallel", "field", "message"), [
    ({"colocate_actor_rollout": False}, "parallel.rollout_devices",
     "0: a rollout pool of its own takes 1 to 3 of the run's 4 devices"),
    ({"colocate_actor_rollout": False, "rollout_devices": 4}, "parallel.rollout_devices",
     "leaves the rest to train"),
    ({"rollout_devices": 1}, "parallel.rollout_devices",
     "needs parallel.colocate_actor_rollout: false"),
])
def test_pool_layouts_it_cannot_take_are_refused_naming_the_field(parallel, field, message):
    with pytest.raises(SpecError, match=rf"{field}: .*{message}"):
        resolve_spec(spec(**parallel))


def test_what_a_pool_does_not_do_yet_is_refused_naming_the_field():
    grouped = spec(colocate_actor_rollout=False, rollout_devices=2)
    grouped["rollout"] = {"tensor_parallel_size": 2}
    grouped["actor"]["strategy"] = "fsdp2"
    with pytest.raises(SpecError, match=r"rollout.tensor_parallel_size: 2: a rollout pool of "
                                        r"its own generates one device per engine"):
        resolve_spec(grouped)
    dpo = spec(colocate_actor_rollout=False, rollout_devices=1)
    dpo["algorithm"] = "dpo"
    with pytest.raises(SpecError, match=r"parallel.colocate_actor_rollout: false is for grpo"):
        resolve_spec(dpo)
