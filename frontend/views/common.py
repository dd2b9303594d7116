"""What every page view needs: the runs and projects a user may see, a 404 that names no secret."""

from __future__ import annotations

from django.http import Http404

from accounts.choices import WRITE_ROLES
from api.permissions import visible_projects
from experiments.models import Experiment, Run


def visible_runs(user):
    runs = Run.objects.filter(experiment__project__in=visible_projects(user))
    return runs.select_related("experiment__project", "created_by", "cluster")


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

