"""The runs list and a run's page: state, timeline, live charts and logs, spec, checkpoints."""

from __future__ import annotations

import re

import yaml
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from experiments import services
from experiments.choices import ACTIVE_STATES, TERMINAL_STATES, RunState
from experiments.filters import RunFilter
from experiments.models import Experiment, RunTag
from experiments.queries import DEFAULT_ORDER, RUN_ORDERS, is_order, order_runs
from experiments.starter import BUILT_IN_MODELS, DEMO_LINE, DEMO_NAME
from experiments.tracking import (
    TrackingUnavailable,
    artifact_tree,
    artifacts,
    read_bytes,
    read_json,
    run_metrics,
)
from experiments.validation import (MAX_TAGS, NOTE_MAX_CHARS, TAG_MAX_CHARS, RunNotesInput,
                                    split_tags)
from frontend.views.common import can_write_run, is_htmx, ordered_spec, run_or_404, visible_runs
from registry import services as registry
from rl_core.spec import PRESETS, SpecError

# A sample's picture (a vision-language run's samples: `rl_core.recipes.rl`), and the most the
# picture view sends (a 256-pixel PNG is far smaller).
SAMPLE_PICTURE = re.compile(r"samples/step_\d+/\d+_\d+\.png")
MAX_SAMPLE_PICTURE_BYTES = 1 << 20
# Logged steps with a reward of exactly 0 after which the run page says why nothing is learned.
ZERO_REWARD_STEPS = 10
# The charts of a run's page: (title, metric keys); `prefix/*` collects every key under it.
RL_CHARTS = [
    ("Reward", ["reward/mean"]),
    ("KL", ["actor/kl_loss", "actor/ppo_kl"]),
    ("Entropy", ["actor/entropy"]),
    ("Response length", ["response_length/mean", "response_length/max"]),
]
DPO_CHARTS = [
    ("DPO loss", ["dpo/loss"]),
    ("Preference accuracy", ["dpo/rewards/accuracies"]),
    ("Reward margin", ["dpo/rewards/margins"]),
    ("Chosen / rejected reward", ["dpo/rewards/chosen", "dpo/rewards/rejected"]),
]
COMMON_CHARTS = [
    ("Throughput (tokens/s)", ["perf/tokens_per_s"]),
    ("Stage timings (s)", ["timing/*"]),
    ("Validation accuracy", ["val/accuracy"]),
]
# The node's resources while the run trained (MLflow's system metrics, `tools.monitor.
# system_metrics_interval`), drawn against the time since the run's first sample; `*` matches
# any run of characters (a device number).
RESOURCE_CHARTS = [
    ("CPU (%)", ["system/cpu_utilization_percentage"]),
    ("Memory (%)", ["system/system_memory_usage_percentage"]),
    ("Device utilisation (%)", ["system/gpu_*_utilization_percentage"]),
    ("Device memory (%)", ["system/gpu_*_memory_usage_percentage"]),
]


def about(run) -> str:
    """One line on what the run is, where that can be said: the demo, or its built-in model."""
    spec = run.spec or {}
    if spec.get("name") == DEMO_NAME:
        return DEMO_LINE
    model = (spec.get("model") or {}).get("path", "")
    if model in BUILT_IN_MODELS:
        return f"The model {model} is {BUILT_IN_MODELS[model]}."
    return ""


def charts_for(run) -> list[tuple[str, list[str]]]:
    """The charts of the run's algorithm (a chart whose metrics a finished run never logged is
    hidden by the page)."""
    charts = list(DPO_CHARTS if run.algorithm == "dpo" else RL_CHARTS)
    if (run.spec.get("critic") or {}).get("enable"):
        charts.append(("Critic value loss", ["critic/vf_loss"]))
    return charts + COMMON_CHARTS


def chosen_states(params) -> tuple[list[str], list[str]]:
    """(the states asked for, the values that name no state). `state` may repeat or hold a
    comma-separated list, in any case; `active` stands for every state in which a run may hold
    devices."""
    states, unknown = [], []
    for value in params.getlist("state"):
        for state in (part.strip() for part in value.split(",")):
            if not state:
                continue
            names = (sorted(ACTIVE_STATES) if state.lower() == "active"
                     else [state.upper()] if state.upper() in RunState else [])
            if not names:
                unknown.append(state)
            states.extend(s for s in names if s not in states)
    return states, unknown


def run_filter_data(params, states: list[str]) -> QueryDict:
    """The page's filters in the terms of the API's run filter (`q` is its `search`)."""
    data = QueryDict(mutable=True)
    data.setlist("state", states)
    for name in ("experiment", "creator", "algorithm", "tag"):
        data[name] = params.get(name, "")
    data["search"] = params.get("q", "").strip()
    return data


# The runs table's columns, each sortable: (sort key in COLUMN_ORDERS, header, numeric).
RUN_COLUMNS = [
    ("run", "Run", False), ("state", "State", False), ("progress", "Progress", False),
    ("algorithm", "Algorithm", False), ("experiment", "Experiment", False),
    ("creator", "Creator", False), ("devices", "Devices", True), ("submitted", "Submitted", False),
    ("finished", "Finished", False), ("ran", "Ran", True),
]
# Sorting by these columns starts with the largest (newest, longest) first.
_DESCENDING_FIRST = {"progress", "devices", "submitted", "finished", "ran"}


def column_headers(params, sort: str) -> list[dict]:
    """Each column's header: its link sorts by it (again: the other way), `aria_sort` says
    how the table is sorted now. The newest-first default is the submitted column, descending."""
    current = {"newest": "-submitted", "oldest": "submitted", "name": "run", "state": "state"}.get(sort, sort)
    query = params.copy()
    query.pop("page", None)
    headers = []
    for key, label, numeric in RUN_COLUMNS:
        first = f"-{key}" if key in _DESCENDING_FIRST else key
        shown = current.removeprefix("-") == key
        query["sort"] = ((key if current.startswith("-") else f"-{key}") if shown else first)
        headers.append({"label": label, "numeric": numeric, "href": f"?{query.urlencode()}",
                        "aria_sort": ("descending" if current.startswith("-") else "ascending")
                        if shown else "none"})
    return headers


@login_required
def run_list(request):
    """Runs the user may see, filtered by state, experiment, creator, algorithm and a search.
    The filter is the API's; a value it refuses (a stale or hand-typed address) filters
    nothing, where the API answers 400, so the page still shows a list."""
    params = request.GET
    states, unknown = chosen_states(params)
    runs = visible_runs(request.user).defer("spec")  # a table shows no spec
    runs = RunFilter(run_filter_data(params, states), queryset=runs).qs
    sort = params.get("sort", "") if is_order(params.get("sort", "")) else DEFAULT_ORDER
    runs = runs.prefetch_related("tags", registry.versions_prefetch())
    page = Paginator(order_runs(runs, sort), 50).get_page(params.get("page"))
    visible = visible_runs(request.user)
    context = {
        "page": page, "sort": sort, "sorts": list(RUN_ORDERS), "query": params.get("q", "").strip(),
        "headers": column_headers(params, sort),
        "tags": RunTag.objects.filter(run__in=visible).order_by("name")
        .values_list("name", flat=True).distinct()[:200],
        "states": [(s.value, s.label) for s in RunState], "algorithms": list(PRESETS),
        "active": ",".join(sorted(ACTIVE_STATES)),
        "chosen": {"state": ",".join(sorted(states)), "experiment": params.get("experiment", ""),
                   "creator": params.get("creator", ""), "algorithm": params.get("algorithm", ""),
                   "tag": params.get("tag", "")},
        "experiments": Experiment.objects.filter(runs__in=visible).distinct()
        .select_related("project").order_by("project__name", "name"),
        "creators": get_user_model().objects.filter(runs__in=visible).distinct()
        .order_by("username").values_list("username", flat=True),
        "filtered": any(params.get(k) for k in ("state", "experiment", "creator", "algorithm", "tag", "q")),
        "unknown_states": unknown,
    }
    template = "frontend/_runs_table.html" if is_htmx(request) else "frontend/runs.html"
    return render(request, template, context)


def _detail_context(request, run) -> dict:
    return {
        "run": run,
        "attempts": run.attempts.select_related("cluster").order_by("number"),
        "events": run.events.order_by("created_at", "id"),
        "can_write": can_write_run(request.user, run),
        "active": run.state not in TERMINAL_STATES,
        "restartable": run.state in (RunState.FAILED, RunState.CANCELLED),
    }


def starting_model(user, run) -> dict | None:
    """The registered model the run's spec starts from (`models:/...`), with its page."""
    uri = registry.started_from(run)
    if not uri:
        return None
    name = uri.removeprefix("models:/").split("/")[0].split("@")[0]
    model = registry.visible_models(user).filter(name=name).first()
    return {"uri": uri, "model": model}


def _run_page(request, run, status: int = 200, **extra):
    context = _detail_context(request, run)
    context.update({
        "spec_yaml": yaml.safe_dump(ordered_spec(run.spec), sort_keys=False, allow_unicode=True),
        "charts": charts_for(run), "resource_charts": RESOURCE_CHARTS,
        "clones": visible_runs(request.user).filter(cloned_from=run).order_by("created_at"),
        "about": about(run), "zero_reward_steps": ZERO_REWARD_STEPS,
        "started_from": starting_model(request.user, run),
        "notes_form": {"tags": ", ".join(run.tag_names), "note": run.note},
        "tag_limits": {"chars": TAG_MAX_CHARS, "count": MAX_TAGS, "note": NOTE_MAX_CHARS},
        **extra,
    })
    return render(request, "frontend/run.html", context, status=status)


@login_required
def run_detail(request, pk: int):
    return _run_page(request, run_or_404(request.user, pk))


def _notes_errors(serializer, tags: list[str]) -> dict[str, list[str]]:
    """The form's errors by its two fields; an error of one tag names that tag."""
    errors: dict[str, list[str]] = {}
    for field, detail in serializer.errors.items():
        if isinstance(detail, dict):  # {index: [message]} of single tags
            messages_ = [f"“{tags[int(i)]}”: {m}" for i, ms in detail.items() for m in ms]
        else:
            messages_ = [str(m) for m in detail]
        errors.setdefault("tags" if field == "tags" else "note", []).extend(messages_)
    return errors


@login_required
@require_POST
def run_notes(request, pk: int):
    """Save the run's tags (one field, separated by commas) and note; the page again on an
    error, with what was typed and the errors at their fields."""
    run = run_or_404(request.user, pk)
    if not can_write_run(request.user, run):
        messages.error(request, "Viewers cannot change runs: ask a project owner for the "
                                "maintainer role.")
        return redirect("frontend:run", pk=run.pk)
    typed = {"tags": request.POST.get("tags", ""), "note": request.POST.get("note", "")}
    tags = split_tags(typed["tags"])
    serializer = RunNotesInput(data={"tags": tags, "note": typed["note"]})
    if not serializer.is_valid():
        return _run_page(request, run, status=400, notes_form=typed,
                         notes_errors=_notes_errors(serializer, tags), notes_open=True)
    services.annotate_run(run, **serializer.validated_data)
    messages.success(request, f"Run {run.pk}: tags and note saved.")
    return redirect(f"{reverse('frontend:run', args=[run.pk])}#notes")


@login_required
def run_status(request, pk: int):
    """The state header and timeline, polled by the run's page while the run is active. The
    answer that finds the run ended triggers `run-ended`: the checkpoints, samples and stage
    times load once more, with what the run logged at its end."""
    run = run_or_404(request.user, pk)
    response = render(request, "frontend/_run_status.html", _detail_context(request, run))
    if run.is_terminal:  # the last poll: the page's other polled parts load once more
        response["HX-Trigger"] = "run-ended"
    return response


@login_required
def run_checkpoints(request, pk: int):
    """The run's checkpoints in MLflow (a partial, polled while the run is active)."""
    run = run_or_404(request.user, pk)
    context = {"run": run, "active": run.state not in TERMINAL_STATES, "error": ""}
    try:
        rows = artifacts(run)
    except TrackingUnavailable as exc:
        rows, context["error"] = [], exc.shown_to(request.user)
    context["checkpoints"] = sorted((r for r in rows if r["step"] is not None),
                                    key=lambda r: r["step"], reverse=True)
    context["mlflow_url"] = rows[0]["url"] if rows else ""
    context["can_register"] = can_write_run(request.user, run)
    context["model_versions"] = run.model_versions.select_related("model").order_by("id")
    context["model_names"] = run.experiment.project.models.values_list("name", flat=True)
    return render(request, "frontend/_run_checkpoints.html", context)


# `timing/<name>` metrics that are not one stage: the whole step, and the stages' span together.
_TIMING_TOTALS = ("timing/step", "timing/stages")


def stage_breakdown(metrics: dict) -> list[dict]:
    """Each stage's mean seconds per step over the logged history (`timing/<stage>`), its share
    of the mean step time and its last value, largest first."""
    history = metrics["history"]
    mean = {key: sum(p[1] for p in points) / len(points)  # points: [step, value, time]
            for key, points in history.items() if points}
    step = mean.get("timing/step") or sum(v for k, v in mean.items() if k not in _TIMING_TOTALS)
    rows = [{"stage": key.removeprefix("timing/"), "mean": value, "steps": len(history[key]),
             "last": history[key][-1][1], "share": value / step if step else 0.0}
            for key, value in mean.items() if key not in _TIMING_TOTALS]
    return sorted(rows, key=lambda r: r["mean"], reverse=True)


@login_required
def run_tools(request, pk: int):
    """Where a run's time went and what its tools recorded: the per-stage time breakdown, the
    profiler traces in MLflow, its precision dumps and the determinism report (a partial,
    polled while the run is active)."""
    run = run_or_404(request.user, pk)
    context = {"run": run, "active": run.state not in TERMINAL_STATES, "error": "",
               "stages": [], "step_seconds": None, "traces": [], "determinism": None,
               "dumps": None}
    try:
        keys = [k for k in run_metrics(run, [])["keys"] if k.startswith("timing/")]
        metrics = run_metrics(run, keys, max_points=1000)
        context["stages"] = stage_breakdown(metrics)
        steps = metrics["history"].get("timing/step") or []
        context["step_seconds"] = sum(p[1] for p in steps) / len(steps) if steps else None
        context["traces"] = [{**t, "step": t["path"].split("/")[1].removeprefix("step_"),
                              "name": t["path"].rsplit("/", 1)[-1]}
                             for t in artifact_tree(run, "profiles")]
        context["determinism"] = read_json(run, "determinism/report.json")
        dumps = artifact_tree(run, "precision", depth=3)
        context["dumps"] = {"files": len(dumps), "steps": sorted(
            {int(d["path"].split("/")[1].removeprefix("step_")) for d in dumps})}
    except TrackingUnavailable as exc:
        context["error"] = exc.shown_to(request.user)
    return render(request, "frontend/_run_tools.html", context)


@login_required
def run_samples(request, pk: int):
    """The sample viewer (a partial): the rollout samples the run logged
    (`tools.monitor.sample_every`: `samples/step_<N>.json` in MLflow), one step at a time,
    the latest unless `?step=` names another; polled while the run is active."""
    run = run_or_404(request.user, pk)
    context = {"run": run, "active": run.state not in TERMINAL_STATES, "error": "", "steps": [],
               "step": None, "table": None}
    try:
        steps = sorted(int(f["path"].rsplit("_", 1)[1].removesuffix(".json"))
                       for f in artifact_tree(run, "samples", depth=1)
                       if re.fullmatch(r"samples/step_\d+\.json", f["path"]))
        asked = request.GET.get("step", "")
        chosen = int(asked) if asked.isascii() and asked.isdigit() else None
        step = chosen if chosen in steps else (steps[-1] if steps else None)
        context.update(steps=steps, step=step, following=chosen is None)
        if step is not None:
            table = read_json(run, f"samples/step_{step}.json") or {}
            columns = table.get("columns", [])
            kinds = ["images" if c == "images" else "turns" if c == "turns" else
                     "num" if c.startswith("reward") or c in ("response_tokens", "tool_calls")
                     else "text" for c in columns]
            shown = {"images": _pictures, "turns": _turns}
            context["table"] = {"columns": list(zip(columns, kinds)),
                                "rows": [[(shown[kind](cell) if kind in shown else cell, kind)
                                          for cell, kind in zip(row, kinds)]
                                         for row in table.get("data", [])]}
    except TrackingUnavailable as exc:
        context["error"] = exc.shown_to(request.user)
    return render(request, "frontend/_run_samples.html", context)


def _turns(cell) -> list[tuple[str, str]]:
    """(role, text) of each part of a multi-turn sample's `turns` cell: the model's turns and
    the tools' answers in order (role "model" or "tool"); anything else in the cell is left
    out."""
    return [(part["role"], str(part.get("text", ""))) for part in
            (cell if isinstance(cell, list) else [])
            if isinstance(part, dict) and part.get("role") in ("model", "tool")]


def _pictures(cell) -> list[str]:
    """The picture paths of a samples table's `images` cell that the picture view serves."""
    return [p for p in (cell if isinstance(cell, list) else []) if isinstance(p, str)
            and SAMPLE_PICTURE.fullmatch(p)]


@login_required
def run_sample_picture(request, pk: int):
    """One picture of the sample viewer (`?path=samples/step_<N>/<row>_<image>.png`): the image
    a vision-language run's model saw for a logged sample, read from MLflow."""
    run = run_or_404(request.user, pk)
    path = request.GET.get("path", "")
    if not SAMPLE_PICTURE.fullmatch(path):
        raise Http404("No such sample picture: the path names none a run logs.")
    try:
        data = read_bytes(run, path, MAX_SAMPLE_PICTURE_BYTES)
    except TrackingUnavailable as exc:
        return HttpResponse(exc.shown_to(request.user), status=503,
                            content_type="text/plain; charset=utf-8")
    if data is None:
        raise Http404(f"Run {run.pk} logged no picture {path}.")
    response = HttpResponse(data, content_type="image/png")
    response["Cache-Control"] = "private, max-age=86400"  # a logged artifact never changes
    return response


@login_required
def run_log(request, pk: int):
    """The run's whole log as a text file: every attempt's job log in order, each after a line
    naming it (streamed: a long log is never held in memory)."""
    run = run_or_404(request.user, pk)
    attempts = list(run.attempts.select_related("cluster").order_by("number"))

    def lines():
        if not attempts:
            yield f"Run {run.pk} has not started: no log yet.\n"
        for attempt in attempts:
            yield (f"──── run {run.pk}, attempt {attempt.number} on {attempt.cluster.name} "
                   f"(Ray job {attempt.ray_submission_id}) ────\n")
            for text in attempt.log_chunks.order_by("offset").values_list("text", flat=True).iterator():
                yield text
            yield "\n"

    response = StreamingHttpResponse(lines(), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}.log"'
    return response


def _act(request, pk: int, act, done: str):
    run = run_or_404(request.user, pk)
    if not can_write_run(request.user, run):
        messages.error(request, "Viewers cannot change runs: ask a project owner for the "
                                "maintainer role.")
        return redirect("frontend:run", pk=run.pk)
    try:
        result = act(run, request.user)
    except (services.DomainError, SpecError) as exc:  # a stored spec today's rules refuse
        messages.error(request, str(exc))
        return redirect("frontend:run", pk=run.pk)
    messages.success(request, done.format(run=run, result=result))
    return redirect("frontend:run", pk=result.pk)


@login_required
@require_POST
def run_cancel(request, pk: int):
    return _act(request, pk, services.cancel_run, "Run {run.pk}: cancel requested.")


@login_required
@require_POST
def run_restart(request, pk: int):
    return _act(request, pk, services.restart_run,
                "Run {result.pk} continues run {run.pk} from its latest checkpoint.")
