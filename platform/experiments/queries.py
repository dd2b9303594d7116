"""The run queries the REST API and the web UI share: which runs a user sees, search, order."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from accounts.models import Membership
from experiments.models import Run

ID_MAX = 2**63 - 1  # PostgreSQL bigint; every id column fits in it
# The orders a run list offers, by name; each ends with the id so that pages are stable.
RUN_ORDERS = {
    "newest": ("-created_at", "-id"),
    "oldest": ("created_at", "-id"),
    "priority": ("-priority", "-id"),
    "name": ("name", "-id"),
    "state": ("state", "-id"),
}
DEFAULT_ORDER = "newest"


def visible_runs(user) -> QuerySet[Run]:
    """Runs of the projects the user is a member of; staff see every run. A semi-join on the
    memberships, so a run is listed once however many members its project has."""
    if user.is_staff:
        return Run.objects.all()
    return Run.objects.filter(
        experiment__project_id__in=Membership.objects.filter(user=user).values("project_id"))


def search_runs(runs: QuerySet[Run], text: str) -> QuerySet[Run]:
    """Runs in which every word of `text` appears in the run's or its experiment's name
    (any case); a word that is a run id, with or without a leading #, also matches that run."""
    for word in text.split():
        match = Q(name__icontains=word) | Q(experiment__name__icontains=word)
        number = word.removeprefix("#")
        if number.isdecimal() and int(number) <= ID_MAX:
            match |= Q(pk=int(number))
        runs = runs.filter(match)
    return runs


def order_runs(runs: QuerySet[Run], order: str) -> QuerySet[Run]:
    """`runs` in one of RUN_ORDERS (an unknown name: newest first)."""
    return runs.order_by(*RUN_ORDERS.get(order, RUN_ORDERS[DEFAULT_ORDER]))
