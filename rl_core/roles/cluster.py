"""Starting the roles: in this process, or as Ray actors placed on the spec's devices.

    roles = local_roles(spec, ...)      # one process: the same workers, called directly
    roles = ray_roles(spec, ...)        # joins RAY_ADDRESS or starts a local Ray
    ...
    roles.shutdown()                    # always: kills the actors, stops a Ray it started

Placement: one placement group with a bundle per device (`resources.devices_per_node` ×
`resources.num_nodes`), each bundle one device of the spec's kind plus
`resources.cpus_per_device` CPUs and, when `resources.memory_gb` is set, that node's host memory
divided by its devices (Ray's `memory` resource, in bytes). Rank r of every device role (actor,
reference, critic, reward model) sits on bundle r and takes an equal share of it: the roles are
colocated on the same devices, as MindSpeed RL colocates them, and a role's ranks form its
data-parallel group. Rule-reward workers use no reserved resources (they score text on the CPU
between the device stages).

Before any role starts, the Ray cluster's resources are compared with what the spec asks for;
too few devices, CPUs or memory is an `InputError` listing both.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from rl_core import device as devices
from rl_core import stopping
from rl_core.determinism import process_env
from rl_core.errors import InputError
from rl_core.roles.actors import (
    ActorWorker,
    CriticWorker,
    ReferenceWorker,
    RewardModelWorker,
    RewardWorker,
    RolloutWorker,
)
from rl_core.roles.group import LocalGroup, RayGroup
from rl_core.rollout.sampling import SamplingParams
from rl_core.spec import RunSpec

log = logging.getLogger("rl_core")

PLACEMENT_TIMEOUT_S = float(os.environ.get("RL_CORE_PLACEMENT_TIMEOUT_S", "60"))
ROLE_START_TIMEOUT_S = float(os.environ.get("RL_CORE_ROLE_START_TIMEOUT_S", "600"))
GIB = 2**30


@dataclass
class Roles:
    """The groups of one run and the data channel between their stages."""

    actor: Any
    reward: Any  # None without reward.functions (a reward model alone)
    channel: Any
    reference: Any = None
    reward_model: Any = None
    critic: Any = None
    rollout: Any = None  # a rollout pool of its own (parallel.colocate_actor_rollout: false)
    on_shutdown: list[Any] = field(default_factory=list)

    @property
    def groups(self) -> list[Any]:
        return [g for g in (self.actor, self.rollout, self.reference, self.critic,
                            self.reward_model, self.reward) if g is not None]

    @property
    def local(self) -> bool:
        return isinstance(self.actor, LocalGroup)

    def shutdown(self) -> None:
        for group in self.groups:
            try:
                group.shutdown()
            except Exception:  # noqa: BLE001 - shut the others down regardless
                log.exception("shutting down role %s", group.name)
        for action in self.on_shutdown:
            action()


def local_roles(spec: RunSpec, *, model_path: str, total_steps: int, reference: bool,
                sampling: SamplingParams, reference_from_policy: bool,
                critic_path: str | None = None, device: str | None = None) -> Roles:
    """Every role in this process (one rank each); `sampling`: the controller's parameters."""
    from rl_core.data.channel import DataChannel

    actor = ActorWorker(spec, model_path=model_path, total_steps=total_steps, sampling=sampling,
                        device=device)
    ref = None
    if reference:
        import copy

        model = copy.deepcopy(actor.model) if reference_from_policy else None
        ref = LocalGroup("reference", [ReferenceWorker(spec, sampling=sampling, device=device,
                                                       model=model)])
    critic = None
    if spec.critic.enable:
        critic = LocalGroup("critic", [CriticWorker(spec, total_steps=total_steps,
                                                    model_path=critic_path, device=device)])
    reward_model = None
    if spec.reward.reward_model is not None:
        reward_model = LocalGroup("reward_model", [RewardModelWorker(
            spec, tokenizer=actor.tokenizer, device=device)])
    reward = LocalGroup("reward", [RewardWorker(spec, tokenizer=actor.tokenizer)]) \
        if has_rule_rewards(spec) else None
    return Roles(actor=LocalGroup("actor", [actor]), reward=reward,
                 channel=DataChannel(ordered=True), reference=ref, critic=critic,
                 reward_model=reward_model)


# --------------------------------------------------------------------------- Ray


def connect() -> bool:
    """Join the Ray cluster of `RAY_ADDRESS` (set inside a Ray job) or start a local one;
    True when this call started it (so the caller stops it)."""
    import ray

    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    options: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING,
                               "log_to_driver": True}
    if address:
        ray.init(address=address, **options)
        stopping.restore_handler()
        log.info("joined the Ray cluster at %s", address)
        return False
    ray.init(**options)
    stopping.restore_handler()
    log.info("started a local Ray instance")
    return True


def bundle_resources(spec: RunSpec) -> dict[str, float]:
    """One rank's placement-group bundle: a device of the spec's kind, its CPUs and, with
    `resources.memory_gb`, its share of the node's host memory in whole bytes (rounded down)."""
    res = spec.resources
    bundle: dict[str, float] = dict(
        devices.ray_resources(devices.get_kind(res.device_type), 1, res.cpus_per_device))
    if res.memory_gb is not None:
        bundle["memory"] = int(res.memory_gb * GIB) // res.devices_per_node
    return bundle


def role_share(bundle: dict[str, float], colocated: int) -> dict[str, Any]:
    """Ray actor options of one of `colocated` roles sharing a bundle equally: `num_cpus`,
    `num_gpus` on GPUs, `memory` in whole bytes (rounded down, so the shares fit the bundle)
    and the other resources (NPU)."""
    share = {k: v / colocated for k, v in bundle.items() if k != "memory"}
    options: dict[str, Any] = {"num_cpus": share.pop("CPU")}
    if "GPU" in share:
        options["num_gpus"] = share.pop("GPU")
    if "memory" in bundle:
        options["memory"] = int(bundle["memory"]) // colocated
    if share:
        options["resources"] = share
    return options


def check_resources(spec: RunSpec, have: dict[str, float]) -> None:
    """Raise an InputError when the cluster has fewer devices, CPUs or bytes of memory (Ray's
    `memory` resource) than the spec asks for."""
    res = spec.resources
    asked = {k: v * spec.world_size for k, v in bundle_resources(spec).items()}
    memory = asked.pop("memory", None)
    problems = []
    if any(have.get(k, 0) < v for k, v in asked.items()):
        shown = ", ".join(f"{k} {have.get(k, 0):g}" for k in sorted({*asked, "CPU", "GPU", "NPU"}))
        wanted = ", ".join(f"{k} {v:g}" for k, v in asked.items())
        problems.append(
            f"resources: the run asks for {wanted} ({res.num_nodes} node(s) x "
            f"{res.devices_per_node} {res.device_type} device(s), {res.cpus_per_device} CPU(s) "
            f"per device) but the Ray cluster has {shown}: lower resources.devices_per_node or "
            "resources.cpus_per_device, or add nodes")
    if memory is not None and have.get("memory", 0) < memory:
        problems.append(
            f"resources.memory_gb: the run asks for {res.memory_gb:g} GiB of host memory per "
            f"node x {res.num_nodes} node(s) ({memory / GIB:.2f} GiB) but the Ray cluster has "
            f"{have.get('memory', 0) / GIB:.2f} GiB of memory (Ray's `memory` resource: what its "
            "nodes leave to tasks and actors beside the object store): lower "
            "resources.memory_gb, set it to null to ask for none, or add nodes")
    if problems:
        raise InputError("; ".join(problems))


def ray_roles(spec: RunSpec, *, model_path: str, total_steps: int, reference: bool,
              sampling: SamplingParams, critic_path: str | None = None) -> Roles:
    """Start every role as Ray actors on one placement group; see the module docstring.
    `sampling`: the controller's parameters, handed to the actor and the reference."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rl_core.data.channel import remote_channel

    started = connect()
    cleanup: list[Any] = []
    if started:
        cleanup.append(ray.shutdown)
    try:
        check_resources(spec, ray.cluster_resources())
        res, kind = spec.resources, devices.get_kind(spec.resources.device_type)
        bundle = bundle_resources(spec)
        strategy = "STRICT_PACK" if res.num_nodes == 1 else "PACK"
        group = placement_group([dict(bundle)] * spec.world_size, strategy=strategy)
        cleanup.insert(0, lambda: remove_placement_group(group))
        if not group.wait(PLACEMENT_TIMEOUT_S):
            hint = ("; every node must hold resources.memory_gb of Ray's `memory` for its "
                    "devices" if "memory" in bundle else "")
            raise InputError(
                f"resources: {spec.world_size} bundles of {bundle} ({strategy}) could not be "
                f"placed within {PLACEMENT_TIMEOUT_S:.0f} s; free: {ray.available_resources()}"
                f"{hint}")
        scored = spec.reward.reward_model is not None
        colocated = 1 + int(reference) + int(spec.critic.enable) + int(scored)
        threads = max(1, res.cpus_per_device // colocated)

        share = role_share(bundle, colocated)
        trains = spec.training_devices  # bundles 0..trains-1; a rollout pool has the rest

        def options(first: int = 0, count: int = trains, on: dict[str, Any] = share,
                    cpus: int = threads) -> list[dict[str, Any]]:
            return [{**on, "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        placement_group=group, placement_group_bundle_index=first + rank),
                     "runtime_env": {"env_vars": _rank_env(cpus, spec)}, "name": None}
                    for rank in range(count)]

        backend = kind.backend
        common = {"size": trains, "backend": backend, "timeout_s": ROLE_START_TIMEOUT_S}
        actor = RayGroup.start("actor", ActorWorker, spec, model_path=model_path,
                               total_steps=total_steps, sampling=sampling, options=options(),
                               **common)
        cleanup.insert(0, actor.shutdown)
        ref = None
        if reference:
            ref = RayGroup.start("reference", ReferenceWorker, spec, sampling=sampling,
                                 options=options(), **common)
            cleanup.insert(0, ref.shutdown)
        critic = None
        if spec.critic.enable:
            critic = RayGroup.start("critic", CriticWorker, spec, total_steps=total_steps,
                                    model_path=critic_path, options=options(), **common)
            cleanup.insert(0, critic.shutdown)
        reward_model = None
        if scored:
            reward_model = RayGroup.start("reward_model", RewardModelWorker, spec,
                                          options=options(), **common)
            cleanup.insert(0, reward_model.shutdown)
        rollout = None
        # the pool: a whole bundle each; its calls in the order submitted (the batches generated
        # ahead, then the weights of the update that ran meanwhile)
        if not spec.parallel.colocate_actor_rollout:
            pool_size = spec.parallel.rollout_devices
            rollout = RayGroup.start(
                "rollout", RolloutWorker, spec, model_path=model_path, size=pool_size,
                backend=backend, timeout_s=ROLE_START_TIMEOUT_S, in_order=True,
                options=options(trains, pool_size, role_share(bundle, 1), res.cpus_per_device))
            cleanup.insert(0, rollout.shutdown)
        reward = None
        if has_rule_rewards(spec):
            reward_ranks = spec.data_parallel_size
            pool = max(1, (os.cpu_count() or 1) // reward_ranks)
            env = {"env_vars": _rank_env(1, spec)}
            reward = RayGroup.start(
                "reward", RewardWorker, spec, num_workers=pool, size=reward_ranks,
                backend=backend, options=[{"num_cpus": 0, "runtime_env": env}] * reward_ranks,
                timeout_s=ROLE_START_TIMEOUT_S)
            cleanup.insert(0, reward.shutdown)
        channel = remote_channel(ordered=True)
        cleanup.insert(0, lambda: ray.kill(channel))
    except BaseException:
        for action in cleanup:
            _quietly(action)
        raise
    roles = Roles(actor=actor, reward=reward, channel=channel, reference=ref, critic=critic,
                  reward_model=reward_model, rollout=rollout)
    # the groups are shut down by Roles.shutdown; then the channel, placement group and Ray
    roles.on_shutdown = [lambda: _quietly(lambda: ray.kill(channel)),
                         lambda: _quietly(lambda: remove_placement_group(group))]
    if started:
        roles.on_shutdown.append(ray.shutdown)
    return roles


def _rank_env(threads: int, spec: RunSpec) -> dict[str, str]:
    """Threads per rank: the CPUs of its share, so colocated ranks do not oversubscribe; with
    `trainer.deterministic` the determinism variables, read by the libraries at start."""
    return {"OMP_NUM_THREADS": str(threads), "RL_CORE_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false", **process_env(spec.trainer.deterministic)}


def _quietly(action) -> None:
    try:
        action()
    except Exception:  # noqa: BLE001 - cleanup after a failure must not mask it
        log.debug("cleanup step failed", exc_info=True)


def has_rule_rewards(spec: RunSpec) -> bool:
    """Whether the run has a reward role: reward functions or a remote reward service (scored
    by the same workers), not only a reward model."""
    return bool(spec.reward.functions) or spec.reward.remote is not None
