"""Experiments group runs; a run is one training job, tried in one or more attempts."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from accounts.models import Project
from ascent.validators import plain_text
from clusters.choices import DeviceKind
from clusters.models import Cluster
from experiments.choices import TERMINAL_STATES, RunState, WaitingCause
from experiments.limits import MAX_RESTARTS, PRIORITY, QUOTA_DEVICES


class Experiment(models.Model):
    """A named series of runs in a project; one MLflow experiment."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="experiments")
    name = models.CharField(max_length=128, validators=[plain_text])
    description = models.TextField(blank=True)
    mlflow_experiment_id = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="unique_experiment_name")
        ]

    def __str__(self) -> str:
        return f"{self.project}/{self.name}"


def planned_steps(spec: dict) -> int | None:
    """Training steps of a resolved spec where it says: `trainer.total_steps`, or the epochs of
    a synthetic task (full batches only, as the loader draws them); None when only the data
    files would tell."""
    trainer, data = spec.get("trainer") or {}, spec.get("data") or {}
    if trainer.get("total_steps"):
        return int(trainer["total_steps"])
    synthetic, batch = data.get("synthetic"), data.get("train_batch_size")
    if synthetic and batch and trainer.get("total_epochs"):
        return int(synthetic["num_train"]) // int(batch) * int(trainer["total_epochs"])
    return None


class Run(models.Model):
    """One training job: a validated spec, a device request and a state."""

    experiment = models.ForeignKey(Experiment, on_delete=models.CASCADE, related_name="runs")
    name = models.CharField(max_length=128, blank=True, validators=[plain_text])
    spec = models.JSONField(help_text="The resolved RunSpec (rl_core.spec), as the trainer reads it.")
    algorithm = models.CharField(max_length=16, db_index=True)
    state = models.CharField(
        max_length=16, choices=RunState.choices, default=RunState.QUEUED, db_index=True
    )
    priority = models.IntegerField(
        default=PRIORITY.default,
        validators=[MinValueValidator(PRIORITY.low), MaxValueValidator(PRIORITY.high)],
        help_text="Higher runs first; ties go to the oldest.",
    )
    device_type = models.CharField(max_length=8, choices=DeviceKind.choices)
    device_count = models.PositiveIntegerField()
    cluster = models.ForeignKey(
        Cluster,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="requested_runs",
        help_text="Run only on this cluster; empty = any cluster that fits.",
    )
    preemptible = models.BooleanField(
        default=True,
        help_text="May be stopped for a run of higher priority when its project holds more "
                  "than its share; it saves its step, goes back to the queue and resumes from "
                  "that checkpoint.")
    max_restarts = models.PositiveIntegerField(default=MAX_RESTARTS.default,
                                               validators=[MaxValueValidator(MAX_RESTARTS.high)])
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="runs"
    )
    cloned_from = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="clones"
    )
    resume_from = models.ForeignKey(
        "self", on_delete=models.SET_NULL, null=True, blank=True, related_name="resumed_by",
        help_text="A restart: this run trains on in that run's output folder, from its latest "
                  "checkpoint.",
    )
    idempotency_key = models.CharField(max_length=128, blank=True)
    idempotency_fingerprint = models.CharField(
        max_length=64, blank=True, help_text="SHA-256 of the submission that used the key."
    )
    mlflow_run_id = models.CharField(max_length=64, blank=True)
    error = models.TextField(blank=True)
    note = models.TextField(blank=True, help_text="What the run is for or what it showed, in "
                            "the words of the people working on it; editable at any time.")
    waiting_reason = models.CharField(
        max_length=500, blank=True,
        help_text="Why a queued run is not placed yet (capacity, an unreachable cluster, ...).",
    )
    waiting_cause = models.CharField(
        max_length=16, choices=WaitingCause.choices, blank=True,
        help_text="The kind of reason a queued run waits: capacity, quota, share, limit or "
                  "cluster; empty when it does not wait.",
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Progress, read from the job's log lines `step N: ...` (rl_core.tracking.STEP_LINE) as the
    # worker stores them: the last step, when it was seen, and the first step seen and when (the
    # pace for the ETA, without the start-up before the first step).
    planned_steps = models.PositiveIntegerField(
        null=True, blank=True,
        help_text="Training steps of the whole run where the spec says (null: the data decides).")
    progress_step = models.PositiveIntegerField(null=True, blank=True,
                                                help_text="The last training step its job logged.")
    progress_at = models.DateTimeField(null=True, blank=True)
    first_step = models.PositiveIntegerField(null=True, blank=True)
    first_step_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["created_by", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="unique_run_idempotency_key",
            )
        ]
        indexes = [models.Index(fields=["state", "-priority", "created_at"])]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def project(self) -> Project:
        return self.experiment.project

    @property
    def progress(self) -> dict | None:
        """Step N of total, percent and the estimated time left (seconds) where known."""
        if self.progress_step is None:
            return None
        total = self.planned_steps
        done = self.progress_step
        eta = None
        if (total and self.first_step_at and self.progress_at and done > (self.first_step or 0)
                and not self.is_terminal):
            pace = (self.progress_at - self.first_step_at).total_seconds() / (done - self.first_step)
            eta = max(0.0, pace * (total - done))
        percent = min(100.0, 100.0 * done / total) if total else None
        return {"step": done, "total": total, "percent": percent, "eta_s": eta}

    @property
    def tag_names(self) -> list[str]:
        """The run's tags by name (from a prefetched `tags` where there is one)."""
        return sorted((tag.name for tag in self.tags.all()), key=str.casefold)

    def measure_pace_again(self) -> None:
        """A new attempt of the run (an automatic restart): the ETA's pace is measured from its
        first step beyond the last one seen, not across the time the restart took."""
        Run.objects.filter(pk=self.pk).update(first_step=None, first_step_at=None)
        self.first_step = self.first_step_at = None

    def record_progress(self, step: int, at) -> None:
        """Store a step the job logged (steps only go forward; a restart may repeat some)."""
        fields = {"progress_step": step, "progress_at": at}
        if self.first_step_at is None:
            fields.update(first_step=step, first_step_at=at)
        if self.progress_step is None or step > self.progress_step:
            Run.objects.filter(pk=self.pk).update(**fields)
            for name, value in fields.items():
                setattr(self, name, value)


class DeviceQuota(models.Model):
    """The most devices of one kind that a project's active runs may hold at once; set by
    platform administrators. No row for a kind: no limit. Lowering it below what the project
    holds stops new admissions only."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="device_quotas")
    device_type = models.CharField(max_length=8, choices=DeviceKind.choices)
    devices = models.PositiveIntegerField(validators=[MaxValueValidator(QUOTA_DEVICES.high)])
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["project", "device_type"]
        constraints = [models.UniqueConstraint(fields=["project", "device_type"],
                                               name="unique_project_device_quota")]

    def __str__(self) -> str:
        return f"{self.project}: {self.devices} {self.device_type}"


class RunTag(models.Model):
    """A label on a run (`baseline`, `lr-sweep`, `paper`): runs are found and grouped by them."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="tags")
    name = models.CharField(max_length=40)

    class Meta:
        ordering = ["name"]  # not by run: a prefetch of tags would join the runs for their order
        constraints = [models.UniqueConstraint(fields=["run", "name"], name="unique_run_tag")]
        indexes = [models.Index(fields=["name"])]

    def __str__(self) -> str:
        return self.name


class Attempt(models.Model):
    """One launch of a run as a Ray job; a restart from checkpoint is a new attempt."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    ray_submission_id = models.CharField(max_length=128, unique=True)
    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="attempts")
    device_count = models.PositiveIntegerField(help_text="Devices held while the attempt is active.")
    started_at = models.DateTimeField(auto_now_add=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    exit_message = models.TextField(blank=True)
    launched_at = models.DateTimeField(null=True, blank=True, help_text="When its Ray job was submitted.")
    last_seen_at = models.DateTimeField(
        null=True, blank=True, help_text="When the cluster last reported its job's status."
    )
    log_offset = models.PositiveBigIntegerField(default=0, help_text="Characters of its job log stored.")
    preempted = models.BooleanField(
        default=False, help_text="Ended by a preemption: it does not count as a restart.")

    class Meta:
        ordering = ["run", "number"]
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="unique_attempt_number")]

    def __str__(self) -> str:
        return f"attempt {self.number} of run {self.run_id}"

    @staticmethod
    def submission_id(run_id: int, number: int) -> str:
        """Derived from run and attempt, so a repeated launch finds the job instead of adding one."""
        return f"ascent-run-{run_id}-attempt-{number}"


class LogChunk(models.Model):
    """A piece of an attempt's Ray job log, stored as it is read (`offset`: its first character)."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="log_chunks")
    offset = models.PositiveBigIntegerField()
    text = models.TextField()

    class Meta:
        ordering = ["attempt", "offset"]
        constraints = [models.UniqueConstraint(fields=["attempt", "offset"], name="unique_log_offset")]


class RunEvent(models.Model):
    """One state change of a run: who, when, from what, to what, and why."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    from_state = models.CharField(max_length=16, choices=RunState.choices, blank=True)
    to_state = models.CharField(max_length=16, choices=RunState.choices)
    created_at = models.DateTimeField(auto_now_add=True)
    actor = models.CharField(max_length=150, help_text="A username, or 'system:<component>'.")
    message = models.TextField(blank=True)

    class Meta:
        ordering = ["run", "created_at", "id"]

    def __str__(self) -> str:
        return f"run {self.run_id}: {self.from_state or '∅'} → {self.to_state}"
