from django.contrib import admin

from experiments.models import Attempt, Experiment, Run, RunEvent


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "mlflow_experiment_id", "created_by", "created_at"]
    list_filter = ["project"]
    search_fields = ["name", "description"]


class AttemptInline(admin.TabularInline):
    model = Attempt
    extra = 0
    readonly_fields = ["number", "ray_submission_id", "cluster", "device_count", "started_at",
                       "ended_at", "exit_code", "exit_message"]
    can_delete = False


class RunEventInline(admin.TabularInline):
    model = RunEvent
    extra = 0
    readonly_fields = ["from_state", "to_state", "created_at", "actor", "message"]
    can_delete = False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "experiment", "algorithm", "state", "priority", "device_type",
                    "device_count", "created_by", "created_at"]
    list_filter = ["state", "algorithm", "device_type", "experiment__project"]
    search_fields = ["name", "experiment__name", "mlflow_run_id"]
    # State changes go through experiments.services.transition, never through a form.
    readonly_fields = ["state", "spec", "created_at", "updated_at", "started_at", "finished_at",
                       "mlflow_run_id", "error"]
    inlines = [AttemptInline, RunEventInline]
