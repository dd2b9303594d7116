"""Clusters and their nodes, as registered by admins and refreshed by the probe."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from accounts.models import slug_validator
from clusters.choices import ClusterStatus, DeviceKind, DeviceType, NodeState, kind_of
from rl_core.admission import PathPolicy, normalize_root, root_problem

ROOT_FIELDS = ("model_roots", "data_roots", "output_roots")


def validate_labels(value) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValidationError('Labels must be an object of strings, e.g. {"zone": "a"}.')


def validate_roots(value) -> None:
    """A list of absolute folders without `..` (the allowed roots of one kind of path)."""
    if not isinstance(value, list):
        raise ValidationError('Roots must be a list of absolute folders, e.g. ["/models"].')
    problems = [problem for root in value if (problem := root_problem(root))]
    if problems:
        raise ValidationError("; ".join(problems))


def normalize_roots(value: list[str]) -> list[str]:
    """Each root normalized (`/models/./a/` -> `/models/a`), duplicates dropped, order kept."""
    return list(dict.fromkeys(normalize_root(root) for root in value))


def _roots_field(kind: str, example: str) -> models.JSONField:
    return models.JSONField(
        default=list, blank=True, validators=[validate_roots],
        help_text=f"Absolute folders that run specs may name {kind} under, e.g. [\"{example}\"]; "
        "empty: no restriction.",
    )


class Cluster(models.Model):
    """A Ray cluster that runs training jobs, reached through its dashboard (Jobs API) address."""

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    device_type = models.CharField(
        max_length=8,
        choices=DeviceKind.choices,
        default=DeviceKind.CPU,
        help_text="The accelerator kind its training nodes provide.",
    )
    ray_address = models.CharField(
        max_length=255, help_text="Ray dashboard / Jobs API address, e.g. http://head:8265"
    )
    status = models.CharField(
        max_length=16, choices=ClusterStatus.choices, default=ClusterStatus.UNKNOWN
    )
    labels = models.JSONField(default=dict, blank=True, validators=[validate_labels])
    model_roots = _roots_field("model folders (model.path, critic.model_path, ...)", "/models")
    data_roots = _roots_field("data files (data.train_files, data.val_files)", "/data")
    output_roots = _roots_field("outputs (trainer.output_dir, trainer.resume_path)", "/srv/runs")
    allow_trust_remote_code = models.BooleanField(
        default=False,
        help_text="Runs may set model.trust_remote_code (run code from a model folder).",
    )
    last_probe_at = models.DateTimeField(null=True, blank=True)
    last_probe_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        for name in ROOT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, list) and not any(map(root_problem, value)):
                setattr(self, name, normalize_roots(value))

    def path_policy(self) -> PathPolicy:
        """The cluster's path policy, as rl_core.paths checks it."""
        return PathPolicy.from_mapping({
            "cluster": self.name, **{name: getattr(self, name) for name in ROOT_FIELDS},
            "allow_trust_remote_code": self.allow_trust_remote_code,
        })


class Node(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    hostname = models.CharField(max_length=255)
    address = models.GenericIPAddressField(null=True, blank=True)
    device_type = models.CharField(
        max_length=16, choices=DeviceType.choices, default=DeviceType.CPU
    )
    device_count = models.PositiveIntegerField(default=0)
    healthy_device_count = models.PositiveIntegerField(default=0)
    memory_bytes = models.PositiveBigIntegerField(default=0)
    cpu_count = models.PositiveIntegerField(default=0, validators=[MinValueValidator(0)])
    labels = models.JSONField(default=dict, blank=True, validators=[validate_labels])
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.READY)
    last_seen = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster", "hostname"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "hostname"], name="unique_node_hostname"),
            models.CheckConstraint(
                condition=models.Q(healthy_device_count__lte=models.F("device_count")),
                name="healthy_devices_at_most_devices",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.hostname} ({self.cluster})"

    @property
    def device_kind(self) -> DeviceKind:
        return kind_of(self.device_type)

    def clean(self) -> None:
        if self.healthy_device_count > self.device_count:
            raise ValidationError(
                {"healthy_device_count": "Cannot exceed device_count."}
            )
