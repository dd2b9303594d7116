"""The run queries the REST API and the web UI share: which runs a user sees, search, order."""

from __future__ import annotations

import re

from django.db.models import DurationField, ExpressionWrapper, F, FloatField, Q, QuerySet

from accounts.models import Membership
from experiments.models import Run, RunTag

ID_MAX = 2**63 - 1  # PostgreSQL bigint; every id column fits in it
# An id as a path segment or parameter: ASCII digits only. Python's int() and str.isdigit() also
# take "+1", " 1", "1_0", "١" (Arabic-Indic) and "²" (which int() then refuses), so one rule
# decides what an id is everywhere, and a proxy matching [0-9]+ routes what the service serves.
ID_PATTERN = "[0-9]{1,19}"
_ID = re.compile(ID_PATTERN)


def parse_id(text: str | None) -> int | None:
    """`text` as a row id (1 to ID_MAX, ASCII digits, nothing around them), or None."""
    if not text or not _ID.fullmatch(text):
        return None
    number = int(text)
    return number if 1 <= number <= ID_MAX else None


# The orders a run list offers by name; each ends with the id so that pages are stable.
RUN_ORDERS = {
    "newest": ("-created_at", "-id"),
    "oldest": ("created_at", "-id"),
    "priority": ("-priority", "-id"),
    "name": ("name", "-id"),
    "state": ("state", "-id"),
}
DEFAULT_ORDER = "newest"
# The columns a run table sorts by (its headers): `<column>` ascending, `-<column>` descending;
# empty values (a run not finished, not started) come last either way.
_RAN = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
_PROGRESS = ExpressionWrapper(F("progress_step") * 1.0 / F("planned_steps"), output_field=FloatField())
COLUMN_ORDERS = {
    "run": (F("name"),),
    "state": (F("state"),),
    "progress": (_PROGRESS, F("progress_step")),
    "algorithm": (F("algorithm"),),
    "experiment": (F("experiment__project__name"), F("experiment__name")),
    "creator": (F("created_by__username"),),
    "devices": (F("device_count"), F("device_type")),
    "submitted": (F("created_at"),),
    "finished": (F("finished_at"),),
    "ran": (_RAN,),
}


def is_order(name: str) -> bool:
    """A named order or a column order (`state`, `-finished`)."""
    return name in RUN_ORDERS or name.removeprefix("-") in COLUMN_ORDERS


def visible_runs(user) -> QuerySet[Run]:
    """Runs of the projects the user is a member of; staff see every run. A semi-join on the
    memberships, so a run is listed once however many members its project has."""
    if user.is_staff:
        return Run.objects.all()
    return Run.objects.filter(
        experiment__project_id__in=Membership.objects.filter(user=user).values("project_id"))


def with_tag_names(rows: list[dict]) -> list[dict]:
    """Rows of runs (`QuerySet.values`, with their `id`), each given its `tags` by name, sorted
    as `Run.tag_names` sorts them: one query for the whole page."""
    tags: dict[int, list[str]] = {row["id"]: [] for row in rows}
    for run_id, name in (RunTag.objects.filter(run_id__in=list(tags)).order_by("name")
                         .values_list("run_id", "name")):
        tags[run_id].append(name)
    for row in rows:
        row["tags"] = sorted(tags[row["id"]], key=str.casefold)
    return rows


def tagged(tag: str, lookup: str = "iexact") -> Q:
    """Runs with this tag (any case, inner whitespace as single spaces; `lookup="icontains"`:
    a tag that holds it); a subquery, so a run is listed once however many tags it has."""
    name = " ".join(tag.split())
    return Q(pk__in=RunTag.objects.filter(**{f"name__{lookup}": name}).values("run_id"))


def search_runs(runs: QuerySet[Run], text: str) -> QuerySet[Run]:
    """Runs in which every word of `text` appears in the run's or its experiment's name or in
    one of its tags (any case); a word that is a run id, with or without a leading #, also
    matches that run."""
    for word in text.split():
        match = (Q(name__icontains=word) | Q(experiment__name__icontains=word)
                 | tagged(word, "icontains"))
        number = parse_id(word.removeprefix("#"))
        if number is not None:
            match |= Q(pk=number)
        runs = runs.filter(match)
    return runs


def order_runs(runs: QuerySet[Run], order: str) -> QuerySet[Run]:
    """`runs` in one of RUN_ORDERS or COLUMN_ORDERS (an unknown name: newest first)."""
    column = COLUMN_ORDERS.get(order.removeprefix("-"))
    if column is None:
        return runs.order_by(*RUN_ORDERS.get(order, RUN_ORDERS[DEFAULT_ORDER]))
    descending = order.startswith("-")
    return runs.order_by(*(e.desc(nulls_last=True) if descending else e.asc(nulls_last=True)
                           for e in column), "-id")
