"""`RunSpec`: everything needed to start an RL post-training run, checked by its sections' types,
then `NOT_IMPLEMENTED`, then the cross-field rules."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import yaml
from pydantic import Field, field_validator, model_validator

from rl_core.spec.limits import Algorithm, MAX_INT, Strict, Violation, plain_text_problem
from rl_core.spec.rules import RULES, refusals
from rl_core.spec.sections import (
    ActorConfig,
    AdvantageConfig,
    CriticConfig,
    DPOConfig,
    DataConfig,
    ModelConfig,
    ParallelConfig,
    ReferenceConfig,
    ResourcesConfig,
    RewardConfig,
    RolloutConfig,
    ToolsConfig,
    TrainerConfig,
)

# --------------------------------------------------------------------------- the spec


class SpecRuleViolation(ValueError):
    """Raised by the `RunSpec` validator with every broken cross-field rule."""

    def __init__(self, violations: list[Violation]):
        self.violations = violations
        super().__init__("\n".join(f"{field}: {message}" for field, message in violations))


class RunSpec(Strict):
    """Everything needed to start an RL post-training run."""

    algorithm: Algorithm = Field("grpo", description="grpo, dapo, ppo or dpo; selects the preset.")
    name: str | None = Field(None, max_length=128,
                             description="Free-form run name: one line of plain text.")
    seed: int = Field(1234, ge=0, lt=MAX_INT, description="Seed of every random generator.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompts and batching.")
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="Response generation."
    )
    actor: ActorConfig = Field(default_factory=ActorConfig, description="Policy update.")
    advantage: AdvantageConfig = Field(
        default_factory=AdvantageConfig, description="Advantages and reward shaping."
    )
    dpo: DPOConfig = Field(default_factory=DPOConfig, description="DPO loss.")
    reference: ReferenceConfig = Field(
        default_factory=ReferenceConfig, description="Reference policy."
    )
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value model.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Scoring.")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig, description="Parallel layout.")
    resources: ResourcesConfig = Field(
        default_factory=ResourcesConfig, description="Devices requested."
    )
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Training loop.")
    tools: ToolsConfig = Field(
        default_factory=ToolsConfig, description="Profiling, precision, monitoring."
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str | None) -> str | None:
        problem = plain_text_problem(name) if name else None
        if problem:
            raise ValueError(problem)
        return name

    @model_validator(mode="after")
    def _check_rules(self) -> RunSpec:
        # A value that is not implemented yet is reported alone: rules about it would only confuse.
        violations = refusals(self) or [v for rule in RULES for v in rule(self)]
        if violations:
            raise SpecRuleViolation(violations)
        return self

    @property
    def world_size(self) -> int:
        """Devices in the run."""
        return self.resources.num_nodes * self.resources.devices_per_node

    @property
    def training_devices(self) -> int:
        """Devices that train (every device, unless a rollout pool has its own)."""
        return self.world_size - self.parallel.rollout_devices

    @property
    def model_parallel_size(self) -> int:
        """Devices holding one copy of the model: tensor × pipeline × context parallel."""
        p = self.parallel
        return p.tensor_parallel_size * p.pipeline_parallel_size * p.context_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """Model replicas: `parallel.data_parallel_size`, or derived from the device count."""
        return (self.parallel.data_parallel_size
                or self.training_devices // self.model_parallel_size)

    def data_rank(self, rank: int) -> int:
        """The data-parallel index of training rank `rank`: which share of the rows it holds.
        The ranks of a tensor- × context- × pipeline-parallel block hold the same rows: blocks
        of consecutive ranks, but with actor.strategy: megatron, whose order is tensor, context,
        data, pipeline (a pipeline's stages lie data_parallel_size blocks apart), the ranks of
        each stage's tensor × context block."""
        p = self.parallel
        if self.actor.strategy == "megatron":
            return (rank // (p.tensor_parallel_size * p.context_parallel_size)
                    ) % self.data_parallel_size
        return rank // self.model_parallel_size

    def device_request(self) -> dict[str, Any]:
        """What the scheduler must find for this run."""
        return {
            "device_type": self.resources.device_type,
            "device_count": self.world_size,
            "num_nodes": self.resources.num_nodes,
            "devices_per_node": self.resources.devices_per_node,
        }

    def to_yaml(self) -> str:
        """The resolved spec as YAML, in declaration order; it resolves back to an equal spec."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True)

    def flat_params(self) -> dict[str, str]:
        """Every leaf as `dotted.key -> text` (list items by index), for MLflow params."""
        return flatten_params(self.model_dump(mode="json"))


def flatten_params(value: Any, prefix: str = "") -> dict[str, str]:
    """Leaves of nested dicts and lists as dotted keys; non-text values as JSON."""
    if isinstance(value, dict) and value:
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list) and value:
        items = enumerate(value)
    else:
        return {prefix: value if isinstance(value, str) else json.dumps(value)}
    flat: dict[str, str] = {}
    for key, item in items:
        flat.update(flatten_params(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat
