"""Admission: can a resolved run spec run where it would go? One call answers it for the REST
API, the web UI (both through `platform/experiments/services.py`) and the command line
(`python -m rl_core spec validate` and `plan`):

    admission = admit(spec, Facts(policies=(policy,), device_model="nvidia-a100"))
    admission.refusals   # [{"field": "reward.functions.0.name", "message": "..."}, ...]
    admission.memory     # the memory plan on the largest device the run could get, or why none

What the spec's own validation cannot know is checked here: that every reward function and
every tool of multi-turn rollouts exists and takes its keyword arguments, that the model has
what the spec asks of it (experts for expert parallelism, a layout its kind supports:
`rl_core.spec.model_violations`), that every path lies inside the roots of the path policy of
where the run would go, that the host memory asked for fits a node there, and the memory plan
of the model (a built-in `tiny:` preset, its config.json, or a known model's figures) on the
device it would get. A memory plan that does not fit is a verdict, not a refusal: the caller
decides (the platform refuses unless told to ignore it; `plan` only prints it).

This module is the platform's door into rl_core (tests/platform/test_layering.py names the
whole surface the platform may import); it imports no torch, so the web process admits runs
without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rl_core import memory_plan as plans
from rl_core.errors import InputError
from rl_core.memory_plan import DEFAULT_DEVICE_MODEL, GIB, PHASES, MemoryPlan, device_memory_of
from rl_core.models.presets import WARM_BASES
from rl_core.models.registry import parse_registry_uri
from rl_core.paths import (
    POLICY_ENV,
    PathPolicy,
    check_paths,
    env_policy,
    normalize_root,
    root_problem,
)
from rl_core.rewards import registry as reward_registry
from rl_core.spec import RunSpec, model_violations

__all__ = [
    "DEFAULT_DEVICE_MODEL", "GIB", "PHASES", "POLICY_ENV", "Admission", "Facts", "MemoryPlan",
    "MemoryVerdict", "PathPolicy", "admit", "built_in_models", "check_paths", "parse_registry_uri",
    "device_memory_of", "launched", "memory_verdict", "normalize_root", "root_problem",
]

Refusal = dict[str, str]  # {"field": dotted spec field, "message": what is wrong and what to do}


@dataclass(frozen=True)
class Facts:
    """What is known of where the run would go. The default knows nothing of it: rewards and the
    memory plan (on the spec's device kind's default device) are still checked.

    `policies`: the path policies of the clusters that could take the run (none: no path policy
    applies). `cluster`: the one cluster the run was sent to, when it names one (else any of
    `policies`' clusters may take it, and a path is refused only when every one refuses it).
    `output_dir`: where the launcher writes each run's output; it replaces `trainer.output_dir`
    and `trainer.resume_path` is dropped (a restart resumes from that folder); `output_note`
    ends a refusal of that folder. `nodes`: (host memory in bytes, "where") of each node the run
    could be placed on, 0 bytes when unknown. `device_model` (and its `device_cluster`): the
    largest device the run could get; `device_memory_bytes` overrides its memory.
    """

    policies: tuple[PathPolicy, ...] = ()
    cluster: str | None = None
    output_dir: str | None = None
    output_note: str = ""
    nodes: tuple[tuple[int, str], ...] = ()
    device_model: str | None = None
    device_cluster: str | None = None
    device_memory_bytes: int | None = None

    @classmethod
    def here(cls, device_memory_bytes: int | None = None,
             environ: Mapping[str, str] | None = None) -> Facts:
        """This machine: the path policy the platform hands a job (ASCENT_PATH_POLICY), if any,
        as the one cluster's. ValueError when that policy is malformed."""
        policy = env_policy(environ)
        if policy is None:
            return cls(device_memory_bytes=device_memory_bytes)
        return cls(policies=(policy,), cluster=policy.cluster,
                   device_memory_bytes=device_memory_bytes)


@dataclass(frozen=True)
class MemoryVerdict:
    """The memory plan of a spec on the device it would get; `plan` is None, with `reason`,
    when the model's shape cannot be known here (its folder is on the cluster only)."""

    plan: MemoryPlan | None
    reason: str = ""
    device_model: str | None = None  # the device model whose memory the plan compares with
    device_cluster: str | None = None  # the cluster it is on (None: a default for the kind)

    @property
    def does_not_fit(self) -> bool:
        """The plan says the run would run out of device memory (False when unknown)."""
        return self.plan is not None and self.plan.fits is False

    def to_dict(self) -> dict | None:
        if self.plan is None:
            return None
        return {**self.plan.to_dict(), "device_model": self.device_model,
                "device_cluster": self.device_cluster}


@dataclass(frozen=True)
class Admission:
    """What `admit` found: the refusals (empty: the run may go) and the memory verdict."""

    refusals: tuple[Refusal, ...]
    memory: MemoryVerdict

    @property
    def admitted(self) -> bool:
        return not self.refusals


def admit(spec: RunSpec, facts: Facts = Facts()) -> Admission:
    """Every refusal of `spec` given `facts`, in the order rewards, host memory, paths; and the
    memory verdict."""
    refusals = [*_reward_refusals(spec), *_tool_refusals(spec), *_model_refusals(spec),
                *_host_memory_refusals(spec, facts), *_path_refusals(spec, facts)]
    return Admission(tuple(refusals), memory_verdict(spec, facts))


def built_in_models() -> dict[str, str]:
    """The built-in warm starts a spec may name as `model.path`, with what each is."""
    return {f"tiny:{name}": base.description for name, base in WARM_BASES.items()}


def _reward_refusals(spec: RunSpec) -> list[Refusal]:
    """Reward functions must exist and accept their kwargs, or the run would fail at its start."""
    errors = []
    for i, function in enumerate(spec.reward.functions):
        try:
            fn = reward_registry.get_reward(function.name)
            reward_registry.check_kwargs(function.name, fn, function.kwargs)
        except reward_registry.UnknownRewardError as exc:
            errors.append({"field": f"reward.functions.{i}.name", "message": str(exc)})
        except TypeError as exc:
            errors.append({"field": f"reward.functions.{i}.kwargs", "message": str(exc)})
    return errors


def _tool_refusals(spec: RunSpec) -> list[Refusal]:
    """The tools of multi-turn rollouts must exist and take their kwargs (`rl_core.tools`)."""
    if spec.rollout.multi_turn is None:
        return []
    from rl_core.tools import UnknownToolError, check_tool

    errors = []
    for i, tool in enumerate(spec.rollout.multi_turn.tools):
        try:
            check_tool(tool.name, tool.kwargs)
        except UnknownToolError as exc:
            errors.append({"field": f"rollout.multi_turn.tools.{i}.name", "message": str(exc)})
        except TypeError as exc:
            errors.append({"field": f"rollout.multi_turn.tools.{i}.kwargs", "message": str(exc)})
    return errors


def _model_refusals(spec: RunSpec) -> list[Refusal]:
    """What the model cannot give (expert parallelism of a dense model, a layout a mixture of
    experts does not support), where its shape is known here (a tiny preset, its config.json or
    a known model); otherwise the run checks it when the model loads."""
    try:
        shape = plans.shape_of(spec)
    except InputError:
        return []
    return [{"field": field, "message": message}
            for field, message in model_violations(spec, shape.num_experts, shape.model_type,
                                                   layout=shape)]


def _host_memory_refusals(spec: RunSpec, facts: Facts) -> list[Refusal]:
    """`resources.memory_gb` must fit a node the run could be placed on; where one of those nodes
    has no memory figure (0 bytes), or there is none, nothing is refused."""
    wanted = spec.resources.memory_gb
    if wanted is None or not facts.nodes or any(memory == 0 for memory, _ in facts.nodes):
        return []
    largest, where = max(facts.nodes)
    if wanted * GIB <= largest:
        return []
    kind = spec.device_request()["device_type"]
    scope = f"of cluster {facts.cluster}" if facts.cluster else f"with {kind} devices"
    return [{"field": "resources.memory_gb", "message": (
        f"{wanted:g} GiB per node is more than any node {scope} has (the largest, {where}, "
        f"has {largest / GIB:.1f} GiB): lower it, or set it to null to ask for none")}]


def launched(spec: RunSpec, output_dir: str | None) -> dict[str, Any]:
    """The spec as the job sees it (a JSON mapping): with `output_dir`, the launcher's output
    folder in place of `trainer.output_dir` and no `trainer.resume_path`."""
    data = spec.model_dump(mode="json")
    if output_dir is not None:
        data["trainer"]["output_dir"] = output_dir
        data["trainer"].pop("resume_path", None)
    return data


def _path_refusals(spec: RunSpec, facts: Facts) -> list[Refusal]:
    """The cluster the run was sent to must allow every path; sent to none in particular, at
    least one of the clusters must (placement then only considers those)."""
    if not facts.policies:
        return []
    data = launched(spec, facts.output_dir)
    refused = {policy.cluster: _noted(check_paths(data, policy), facts.output_note)
               for policy in facts.policies}
    if facts.cluster is not None:
        return refused.get(facts.cluster, [])
    if not all(refused.values()):
        return []
    kind = spec.device_request()["device_type"]
    by_field: dict[str, list[str]] = {}
    for errors in refused.values():
        for error in errors:
            by_field.setdefault(error["field"], []).append(error["message"])
    names = ", ".join(sorted(refused))
    return [{"field": field, "message": f"no cluster offering {kind} devices ({names}) allows "
             f"this path: {'; '.join(messages)}. Change the path or ask an admin."}
            for field, messages in by_field.items()]


def _noted(errors: Sequence[Refusal], note: str) -> list[Refusal]:
    return [{**e, "message": e["message"] + note} if e["field"] == "trainer.output_dir" else e
            for e in errors]


def memory_verdict(spec: RunSpec, facts: Facts = Facts()) -> MemoryVerdict:
    """The plan against `facts`' device (its memory: `device_memory_bytes`, else the device
    model's in `DEVICE_MEMORY_GB`, else the spec's device kind's default); no plan, with the
    reason, when the model's shape is unknown here."""
    try:
        shape = plans.shape_of(spec)
    except InputError as exc:
        return MemoryVerdict(None, f"no memory plan: {exc}")
    memory = facts.device_memory_bytes
    if memory is None:
        memory = plans.device_memory_of(facts.device_model or spec.resources.device_type)
    setup = dataclasses.replace(plans.setup_of(spec), device_memory_bytes=memory)
    return MemoryVerdict(plans.plan_setup(setup, shape, memory, spec.model.path),
                         device_model=facts.device_model, device_cluster=facts.device_cluster)

