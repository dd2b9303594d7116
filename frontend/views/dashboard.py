"""The dashboard: the user's queue, what is running, recent failures, and device utilisation."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.db.models import Count, OuterRef, Subquery
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers

from experiments.choices import ACTIVE_STATES, RunState
from experiments.models import Attempt
from frontend.views.clusters import clusters_with_capacity
from frontend.views.common import is_htmx, visible_runs

SHOWN = 10  # rows per table; the counts link to the whole, filtered runs list
RECENT = timedelta(days=7)
# Active states in lifecycle order, for the per-state counts of the running section.
ACTIVE_ORDER = [state for state in RunState if state in ACTIVE_STATES]


def runs_url(*states) -> str:
    return f"{reverse('frontend:runs')}?{urlencode([('state', s) for s in states])}"


def _live(user) -> dict:
    """The counts, the running runs and the queue: re-rendered every 5 s by htmx."""
    runs = visible_runs(user)
    since = timezone.now() - RECENT
    queue = runs.filter(state=RunState.QUEUED).order_by("-priority", "created_at", "id")  # by priority (projects interleave by share)
    running = runs.filter(state__in=ACTIVE_STATES).order_by("-created_at", "-id")
    # Where it runs: the cluster of its latest attempt (run.cluster is only the one it asked for).
    on_cluster = Attempt.objects.filter(run=OuterRef("pk")).order_by("-number").values("cluster__name")
    by_state = dict(running.order_by().values_list("state").annotate(n=Count("id")))
    recent = dict(runs.filter(finished_at__gte=since).order_by().values_list("state")
                  .annotate(n=Count("id")))
    return {
        "queue": queue[:SHOWN], "running": running.annotate(on_cluster=Subquery(on_cluster[:1]))[:SHOWN],
        "stats": [
            ("queued", "Queued", queue.count(), runs_url(RunState.QUEUED)),
            ("running", "Running", sum(by_state.values()), runs_url(*ACTIVE_ORDER)),
            ("failed", "Failed · last 7 days", recent.get(RunState.FAILED, 0), runs_url(RunState.FAILED)),
            ("succeeded", "Succeeded · last 7 days", recent.get(RunState.SUCCEEDED, 0),
             runs_url(RunState.SUCCEEDED)),
        ],
        "active_counts": [(state, by_state[state], runs_url(state))
                          for state in ACTIVE_ORDER if by_state.get(state)],
    }


@login_required
def dashboard(request):
    context = _live(request.user)
    if is_htmx(request):
        response = render(request, "frontend/_dash_live.html", context)
    else:
        runs = visible_runs(request.user)
        failures = list(runs.filter(state=RunState.FAILED, finished_at__gte=timezone.now() - RECENT)
                        .order_by("-finished_at")[:SHOWN])
        for run in failures:
            run.error_line = next(iter(run.error.strip().splitlines()), "")
        context.update(failures=failures, has_runs=runs.exists(), clusters=clusters_with_capacity())
        response = render(request, "frontend/dashboard.html", context)
    # The same URL answers with the page or the partial: caches must tell them apart.
    patch_vary_headers(response, ["HX-Request"])
    return response
