"""What every page view needs: the runs and projects a user may see, a 404 that names no secret."""

from __future__ import annotations

from django.http import Http404

from accounts.choices import WRITE_ROLES
from experiments import queries
from experiments.models import Experiment, Run
from rl_core.spec import RunSpec


def visible_runs(user):
    """The runs the user may see (as in the API), with what a page shows of each."""
    return queries.visible_runs(user).select_related("experiment__project", "created_by", "cluster")


def run_or_404(user, pk: int) -> Run:
    """The run, if the user is a member of its project (or staff); a 404 page otherwise."""
    run = visible_runs(user).filter(pk=pk).first()
    if run is None:
        raise Http404(f"Run {pk} does not exist, or you are not a member of its project.")
    return run


def writable_experiments(user):
    """Experiments the user may submit runs to (owner or maintainer of the project)."""
    experiments = Experiment.objects.select_related("project").order_by("project__name", "name")
    if user.is_staff:
        return experiments
    return experiments.filter(project__memberships__user=user,
                              project__memberships__role__in=WRITE_ROLES).distinct()


def can_write_run(user, run: Run) -> bool:
    return run.experiment.project.can_write(user)


def is_htmx(request) -> bool:
    """A partial update asked for by htmx (it sends HX-Request: true)."""
    return request.headers.get("HX-Request") == "true"


def ordered_spec(spec: dict) -> dict:
    """A stored spec in the RunSpec's field order (the database keeps JSON keys sorted)."""
    try:
        return RunSpec.model_validate(spec).model_dump(mode="json")
    except ValueError:  # stored under older rules: shown as it is
        return spec


def errors_text(serializer) -> str:
    """A serializer's errors as one sentence per field, e.g. 'role: "x" is not a valid choice.'"""
    return " ".join(f"{field}: {text}" if field != "non_field_errors" else str(text)
                    for field, text in flat_errors(serializer.errors))


def flat_errors(errors, prefix: str = ""):
    """(field path, message) pairs of DRF errors, nested ones as `quotas.npu`."""
    for field, texts in errors.items():
        name = f"{prefix}{field}"
        if isinstance(texts, dict):
            yield from flat_errors(texts, f"{name}.")
        else:
            yield from ((name, text) for text in texts)
