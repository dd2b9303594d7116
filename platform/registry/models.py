"""Registered models of a project and their versions, each made from one run's checkpoint.

MLflow's model registry holds each version's files (the run's checkpoint exported as a Hugging
Face folder) under the same name and number, so `models:/<name>/<version>` names it there and in
a run spec; these rows are the platform's record of who registered what from which run, the
version's state while the worker exports it, and its lineage (rl_core.lineage).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from accounts.models import Project
from ascent.validators import plain_text
from experiments.models import Run


class VersionState(models.TextChoices):
    PENDING = "pending", "Exporting"  # queued or being exported and registered by the worker
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class RegisteredModel(models.Model):
    """A named model of a project; its name is unique on the platform, as in MLflow's registry."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="models")
    name = models.CharField(max_length=128, unique=True)
    description = models.TextField(blank=True, max_length=5000, validators=[plain_text])
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ModelVersion(models.Model):
    """One version: a run's checkpoint at `step`, exported and registered by the worker."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField(
        null=True, blank=True, help_text="MLflow's version number, known once registered.")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="model_versions")
    step = models.PositiveIntegerField(help_text="The checkpoint's step (checkpoints/step_N).")
    state = models.CharField(max_length=8, choices=VersionState.choices,
                             default=VersionState.PENDING)
    error = models.TextField(blank=True)
    description = models.TextField(blank=True, max_length=5000, validators=[plain_text])
    tags = models.JSONField(default=dict, blank=True)
    pending_aliases = models.JSONField(default=list, blank=True,
                                       help_text="Aliases asked for, set once it is registered.")
    lineage = models.JSONField(default=dict, blank=True)
    source = models.CharField(max_length=500, blank=True,
                              help_text="The exported folder in MLflow (runs:/<id>/exported/...).")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model", "-id"]
        constraints = [models.UniqueConstraint(fields=["model", "version"],
                                               name="unique_model_version")]

    def __str__(self) -> str:
        return f"{self.model.name} v{self.version or '?'}"

    def alias_names(self) -> list[str]:
        """Its aliases once ready (those asked for while pending)."""
        if self.state != VersionState.READY:
            return list(self.pending_aliases)
        return sorted(a.name for a in self.aliases.all())

    @property
    def uri(self) -> str:
        return f"models:/{self.model.name}/{self.version}" if self.version else ""


class ModelAlias(models.Model):
    """A name for one ready version of a model (`models:/<model>@<alias>`); it moves when set on
    another version."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="aliases")
    name = models.CharField(max_length=64)
    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="aliases")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model", "name"]
        constraints = [models.UniqueConstraint(fields=["model", "name"], name="unique_model_alias")]

    def __str__(self) -> str:
        return f"{self.model.name}@{self.name}"
