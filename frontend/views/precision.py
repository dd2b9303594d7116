"""The precision comparison of two runs: pick a reference run and a run to check, see the first
stage and module where their dumps part, each stage's counts, the rows of a stage and the error of
every module's output along the model (`experiments.precision`)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from experiments.precision import NoDumps, Thresholds, compare_runs
from experiments.queries import parse_id
from experiments.tracking import TrackingUnavailable
from frontend.views.common import visible_runs

RELATIVE = ("MaxRelativeErr", "MinRelativeErr", "MeanRelativeErr", "NormRelativeErr")
MAX_ROWS = 2000  # rows of one stage on the page (the report files hold all)


def _unit(row: dict) -> str:
    return f"{row['worker']}/{row['stage']}" + (f"-{row['call']}" if row.get("call", 1) > 1 else "")


def worst_error(row: dict) -> float | None:
    """A row's largest relative error (of its statistics, or of its elements), or 1 - cosine."""
    values = [row.get(k) for k in (*RELATIVE, "max_rel_err")]
    values = [v for v in values if isinstance(v, (int, float))]
    if isinstance(row.get("cosine"), (int, float)):
        values.append(1 - row["cosine"])
    return max(values) if values else None


def stage_table(rows: list[dict]) -> list[dict]:
    """Per dumped stage (worker and stage): tensors compared, diverged, the first diverged."""
    units: dict[str, dict] = {}
    for row in rows:
        unit = units.setdefault(_unit(row), {"unit": _unit(row), "stage": row["stage"],
                                             "worker": row["worker"], "kind": row["kind"],
                                             "compared": 0, "diverged": 0, "one_sided": 0,
                                             "first": None})
        if row["status"] in ("only_in_a", "only_in_b"):
            unit["one_sided"] += 1
            continue
        unit["compared"] += 1
        if row["diverged"]:
            unit["diverged"] += 1
            unit["first"] = unit["first"] or row
    return list(units.values())


def error_curves(rows: list[dict]) -> list[dict]:
    """A series per module stage: the worst relative error of each module's forward output,
    in the order the model runs them (x: the module's place, y: the error)."""
    series: dict[str, list] = {}
    for row in rows:
        if row["kind"] != "module" or ".forward." not in row["tensor"] or ".output" not in row["tensor"]:
            continue
        error = worst_error(row)
        if error is None:
            continue
        points = series.setdefault(_unit(row), [])
        points.append([len(points), error])
    return [{"label": unit, "points": points} for unit, points in series.items()]


@login_required
def precision_compare(request):
    params = request.GET
    runs = visible_runs(request.user)
    dumped = runs.filter(spec__tools__precision__enable=True).order_by("-created_at")[:200]
    thresholds, errors = Thresholds.from_params(params)
    chosen = {}
    for side in ("a", "b"):
        value = params.get(side, "").strip().lstrip("#")
        if value:
            number = parse_id(value)
            run = runs.filter(pk=number).first() if number else None
            if run is None:
                errors[side] = (f"run {value} does not exist, or you are not a member of its "
                                "project")
            else:
                chosen[side] = run
    context = {"dumped": dumped, "a": chosen.get("a"), "b": chosen.get("b"), "errors": errors,
               "thresholds": thresholds, "report": None, "error": ""}
    if len(chosen) == 2 and not errors:
        try:
            report = compare_runs(chosen["a"], chosen["b"], thresholds)
        except TrackingUnavailable as exc:
            context["error"] = exc.shown_to(request.user)
        except NoDumps as exc:
            context["error"] = str(exc)
        else:
            context.update(report_context(report, params.get("stage", ""), thresholds))
    return render(request, "frontend/precision.html", context)


def report_context(report: dict, stage: str, thresholds: Thresholds) -> dict:
    """What the page shows of a report: the stages, the rows of `stage` (default: the first
    divergence's, else the first stage's), the error curves and their table."""
    rows = report["rows"]
    first = report["first_divergence"]
    stages = stage_table(rows)
    shown = stage or (_unit(first) if first else (stages[0]["unit"] if stages else ""))
    stage_rows = [dict(r, worst=worst_error(r)) for r in rows if _unit(r) == shown]
    curves = error_curves(rows)
    curve_rows = [{"label": c["label"], "count": len(c["points"]),
                   "max": max(y for _, y in c["points"]),
                   "first_over": next((x for x, y in c["points"] if y > thresholds.rel_max), None)}
                  for c in curves if c["points"]]
    return {"report": report, "first": first, "stages": stages, "shown": shown,
            "rows": stage_rows[:MAX_ROWS], "cut": max(0, len(stage_rows) - MAX_ROWS),
            "curves": curves, "curve_rows": curve_rows}
