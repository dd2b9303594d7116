"""Compare runs: overlaid curves of chosen metrics, a table of their final values, a spec diff,
the same comparison in MLflow."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from experiments.tracking import TrackingUnavailable, compare as tracked_metrics
from experiments.queries import parse_id
from frontend.views.common import ordered_spec, visible_runs
from rl_core.spec import flatten_params

DEFAULT_METRICS = ["reward/mean", "actor/kl_loss", "response_length/mean", "actor/entropy"]
MAX_RUNS = 10


def _ids(params) -> list[int]:
    ids = []
    for value in params.getlist("runs"):
        for part in value.split(","):
            number = parse_id(part.strip().lstrip("#"))
            if number is not None and number not in ids:
                ids.append(number)
    return ids[:MAX_RUNS]


def spec_diff(runs) -> list[dict]:
    """Rows of (path, value per run, changed), every path of any run, in spec order."""
    leaves = [flatten_params(ordered_spec(run.spec)) for run in runs]
    paths = list(dict.fromkeys(path for flat in leaves for path in flat))
    rows = []
    for path in paths:
        values = [flat.get(path, "—") for flat in leaves]
        rows.append({"path": path, "values": values, "changed": len(set(values)) > 1})
    return rows


def final_metrics(runs, keys: list[str], history: dict) -> list[dict]:
    """Rows of (metric, the last logged value and its step per run; None where a run has none),
    with the best of the row marked where the runs differ."""
    rows = []
    for key in keys:
        cells = []
        for run in runs:
            points = history.get(run.pk, {}).get(key, [])
            cells.append({"value": points[-1][1], "step": points[-1][0]} if points else None)
        values = [c["value"] for c in cells if c]
        rows.append({"key": key, "cells": cells, "low": min(values) if values else None,
                     "high": max(values) if values else None})
    return rows


@login_required
def compare(request):
    ids = _ids(request.GET)
    runs = list(visible_runs(request.user).filter(pk__in=ids))
    runs.sort(key=lambda run: ids.index(run.pk))
    missing = [pk for pk in ids if pk not in {run.pk for run in runs}]
    context = {"runs": runs, "missing": missing, "max_runs": MAX_RUNS}
    if len(runs) < 2:
        context["recent"] = visible_runs(request.user).order_by("-created_at")[:50]
        return render(request, "frontend/compare.html", context)

    chosen = request.GET.getlist("metric") or DEFAULT_METRICS
    try:
        tracked = tracked_metrics(runs, chosen)
    except TrackingUnavailable as exc:
        tracked = {"keys": [], "history": {}, "mlflow_url": "", "error": exc.shown_to(request.user)}
    keys = [key for key in chosen if key in tracked["keys"]]
    labels = {run.pk: f"#{run.pk} {run.name}".strip() for run in runs}
    context.update({
        "tracked": tracked,
        "chosen": keys,
        "available": tracked["keys"],
        "charts": [{"key": key, "series": [
            {"label": labels[run.pk], "points": tracked["history"].get(run.pk, {}).get(key, [])}
            for run in runs]} for key in keys],
        "finals": final_metrics(runs, keys, tracked["history"]),
        "diff": spec_diff(runs),
        "untracked": [labels[run.pk] for run in runs if not run.mlflow_run_id],
        "ids": ",".join(str(run.pk) for run in runs),
    })
    return render(request, "frontend/compare.html", context)
