"""Submitting a run: algorithm presets, a form generated from the RunSpec schema, a YAML view of
the same spec, a dry run showing the device request and memory plan, inline errors, and no lost
input."""

from __future__ import annotations

import uuid

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from clusters.models import Cluster
from clusters.services import fitting_clusters
from experiments import services
from experiments.limits import RUN_SETTINGS
from experiments.models import Run
from experiments.starter import STARTER_FAMILIES, starter_spec
from frontend import specform
from frontend.views.common import run_or_404, writable_experiments
from experiments.queries import parse_id, visible_runs
from rl_core.admission import GIB, PHASES
from rl_core.spec import PRESETS, SpecError, parse_spec_yaml, resolve_spec

ALGORITHMS = {
    "grpo": "Group-relative advantages, no critic",
    "dapo": "GRPO with clip-higher, dynamic sampling, token-level loss",
    "ppo": "Actor-critic with GAE",
    "dpo": "Preference pairs, no rollout reward",
}
# The form's fields beside the spec editor; errors at them show at the field.
SETTING_FIELDS = ("experiment", "cluster", "cloned_from", "not_preemptible", *RUN_SETTINGS)


class Editor:
    """What the spec editor shows: a mode, the user's texts and the errors at their fields."""

    def __init__(self, mode: str = "form", algorithm: str = "grpo", values=None, yaml_text="",
                 run_name: str = ""):
        self.mode, self.algorithm, self.run_name = mode, algorithm, run_name
        self.values: dict[str, str] = values or {}
        self.yaml_text = yaml_text
        self.errors: dict[str, str] = {}     # by spec path, shown at the field
        self.general: list[str] = []         # errors with no field of their own

    @classmethod
    def from_spec(cls, spec: dict, mode: str = "form") -> Editor:
        return cls(mode, spec.get("algorithm", "grpo"), specform.form_values(spec),
                   specform.to_yaml(spec), spec.get("name") or "")

    @classmethod
    def from_post(cls, data) -> Editor:
        editor = cls(data.get("mode", "form"), data.get("algorithm") or "grpo",
                     run_name=data.get("run_name", ""), yaml_text=data.get("yaml", ""))
        editor.values = {path: data.get(f.name, "") for path, f in specform.all_fields().items()}
        return editor

    def spec(self) -> dict | None:
        """The spec the editor holds, or None with the reasons recorded."""
        if self.mode == "yaml":
            try:
                return parse_spec_yaml(self.yaml_text, "YAML")
            except SpecError as exc:
                self.add(exc.errors)
                return None
        data = {"algorithm": self.algorithm, "run_name": self.run_name,
                **{specform.PREFIX + p: v for p, v in self.values.items()}}
        spec, errors = specform.spec_from_form(data)
        self.errors.update(errors)
        if errors:  # the other fields' problems in the same answer, not in a later round
            try:
                resolve_spec(spec)
            except SpecError as exc:
                self.add([e for e in exc.errors if e["field"] not in errors])
            return None
        return spec

    def add(self, errors: list[dict]) -> None:
        fields = specform.all_fields()
        for error in errors:
            path = error["field"]
            if self.mode == "form" and path in fields:
                self.errors.setdefault(path, error["message"])
            else:
                self.general.append(f"{path}: {error['message']}" if path else error["message"])

    def context(self) -> dict:
        main, sections = specform.sections()
        defaults = specform.defaults(self.algorithm)

        def rows(fields):
            return [{"f": f, "value": self.values.get(f.path, ""), "error": self.errors.get(f.path),
                     "placeholder": specform.display(defaults[f.path], f.kind)
                     if f.path in defaults else "unset"}
                    for f in fields]

        return {
            "editor": self, "algorithms": ALGORITHMS, "main_rows": rows(main),
            "sections": [{"s": s, "rows": rows(s.fields),
                          "open": s.path in specform.OPEN_SECTIONS
                          or any(self.values.get(f.path) or f.path in self.errors for f in s.fields)}
                         for s in sections],
        }


def memory_preview(verdict: services.MemoryVerdict) -> dict:
    """What the dry run shows of a memory plan: the verdict line, where the device memory comes
    from, one row per role of bytes per phase (GiB, or MiB for a plan under one GiB) and the
    total of a device (with a rollout pool of its own: of a training and of a pool device)."""
    plan = verdict.plan
    if plan is None:
        return {"fits": None, "message": verdict.reason}
    unit, size = ("GiB", GIB) if plan.total_bytes >= GIB else ("MiB", 2**20)

    def cells(totals: dict[str, int]) -> list[str]:
        return [f"{totals[phase] / size:.1f}" for phase in PHASES]

    device = verdict.device_model or "unknown device"
    return {
        "fits": plan.fits, "message": plan.message, "unit": unit, "phases": PHASES,
        "peak": plan.peak_phase, "rows": [(role, cells(plan.phase_bytes(role)))
                                          for role in plan.roles],
        "totals": [("total" if len(plan.devices) == 1 else f"total, a {kind} device",
                    cells(plan.phase_bytes(device=kind))) for kind in plan.devices],
        "device": f"{device} on {verdict.device_cluster}" if verdict.device_cluster
        else f"{device} (no such device registered: the kind's default)",
    }


def _page(request, editor: Editor, fields: dict | None = None, **extra):
    """The submit page. A form with errors comes back as 200, like any re-rendered form: a 4xx
    would only add an error line in the browser console, and htmx would not show it."""
    data = request.POST if request.method == "POST" else {}
    context = {
        **editor.context(),
        "experiments": writable_experiments(request.user),
        "clusters": Cluster.objects.order_by("name"),
        "fields": fields or {k: data.get(k, "") for k in SETTING_FIELDS},
        "key": data.get("key") or uuid.uuid4().hex,
        "limits": RUN_SETTINGS,
        "form_errors": {},
        "ignore_memory_plan": bool(data.get("ignore_memory_plan")),
        **extra,
    }
    return render(request, "frontend/submit.html", context)


@login_required
def submit(request):
    if request.method != "POST":
        # a new run starts from the starter spec of its algorithm (it runs and learns on a CPU)
        algorithm, family = request.GET.get("algorithm"), request.GET.get("starter")
        editor = Editor.from_spec(starter_spec(algorithm if algorithm in PRESETS else "grpo",
                                               family if family in STARTER_FAMILIES else "text"))
        fields, source = {}, None
        clone = parse_id(request.GET.get("clone"))
        if clone:
            source = run_or_404(request.user, clone)
            # the fields hold what the source's resolved spec has beyond the preset: submitted
            # unchanged, the clone resolves to exactly the same spec
            spec = specform.minimal(source.spec)
            if source.name:
                spec["name"] = f"{source.name.removesuffix(' (clone)')} (clone)"
            editor = Editor.from_spec(spec)
            fields = {"experiment": str(source.experiment_id), "priority": str(source.priority),
                      "max_restarts": str(source.max_restarts),
                      "not_preemptible": "" if source.preemptible else "1",
                      "cluster": str(source.cluster_id or ""), "cloned_from": str(source.pk)}
        return _page(request, editor, fields, source=source, starters=STARTER_FAMILIES,
                     starter=family if family in STARTER_FAMILIES else "text")

    editor = Editor.from_post(request.POST)
    form_errors = {}
    experiment = writable_experiments(request.user).filter(pk=_int(request.POST.get("experiment"))).first()
    if experiment is None:
        form_errors["experiment"] = "Choose an experiment you may submit to (owner or maintainer)."
    settings = {}
    for name, bounds in RUN_SETTINGS.items():
        settings[name] = _int(request.POST.get(name), bounds.default)
        if settings[name] not in bounds:
            form_errors[name] = bounds.message
    cluster = None
    if request.POST.get("cluster"):
        cluster = Cluster.objects.filter(pk=_int(request.POST["cluster"])).first()
        if cluster is None:
            form_errors["cluster"] = "This cluster no longer exists: choose another or any."
    source = None
    if request.POST.get("cloned_from"):  # the run this form was cloned from, when still visible
        source = visible_runs(request.user).filter(pk=_int(request.POST["cloned_from"])).first()
    spec = editor.spec()
    if spec is None or form_errors:
        return _page(request, editor, form_errors=form_errors, source=source)

    key = request.POST.get("key", "").strip()
    submission = services.Submission(
        spec=spec, name=editor.run_name.strip(), priority=settings["priority"],
        max_restarts=settings["max_restarts"], cluster=cluster,
        preemptible=not request.POST.get("not_preemptible"),
        idempotency_key=f"form-{key}"[:128] if key else "",
        ignore_memory_plan=bool(request.POST.get("ignore_memory_plan")),
    )
    try:
        if request.POST.get("action") == "dry_run":
            prepared = services.prepare(submission)
            device_request = prepared.spec.device_request()
            return _page(request, editor, dry_run={
                "request": device_request, "clusters": fitting_clusters(device_request, cluster),
                "yaml": specform.to_yaml(prepared.spec.model_dump(mode="json"))},
                memory=memory_preview(prepared.memory))
        run, created = services.submit_run(experiment, request.user, submission)
        if created and source is not None:
            Run.objects.filter(pk=run.pk).update(cloned_from=source)
    except services.MemoryRefusal as exc:
        editor.general.append(str(exc))
        return _page(request, editor, memory=memory_preview(exc.verdict))
    except SpecError as exc:
        editor.add(exc.errors)
        return _page(request, editor)
    except services.RequestError as exc:  # the message the API gives at the same field
        if exc.field in SETTING_FIELDS:
            return _page(request, editor, form_errors={exc.field: str(exc)})
        editor.general.append(f"{exc.field}: {exc}")
        return _page(request, editor)
    except services.DomainError as exc:
        editor.general.append(f"{exc} Reload the page to submit a new run.")
        return _page(request, editor)
    if created:
        # a message that stays true: the state header below follows the run (queued, running...)
        messages.success(request, f"Run {run.pk} submitted.")
    else:
        messages.info(request, f"This form was already submitted as run {run.pk}: nothing new was queued.")
    return redirect("frontend:run", pk=run.pk)


@login_required
@require_POST
def convert(request):
    """Switch the editor between form and YAML (htmx), or re-render the form for another preset;
    what cannot be converted stays where it is, with the reason."""
    editor = Editor.from_post(request.POST)
    target = request.GET.get("to", "form")
    shown = request.POST.get("shown_algorithm")
    if editor.mode == "form" and shown in PRESETS and shown != editor.algorithm:
        editor.values = _restart(editor.values, shown, editor.algorithm)
    spec = editor.spec()
    if spec is not None:
        if target == "yaml":
            editor = Editor.from_spec(spec, "yaml")
        else:
            unknown = specform.unplaced(spec)
            if unknown and editor.mode == "yaml":
                editor.general.append("These keys have no field on the form; fix or remove them "
                                      "in YAML: " + ", ".join(unknown))
            else:
                editor = Editor.from_spec(spec, "form")
    return render(request, "frontend/_spec_editor.html", editor.context())


def _restart(values: dict[str, str], old: str, new: str) -> dict[str, str]:
    """The form's texts after the algorithm changed from `old` to `new`: a field still showing
    `old`'s starter value shows `new`'s (so the starter stays one that runs); the user's own
    texts stay as they are."""
    before = specform.form_values(starter_spec(old))
    after = specform.form_values(starter_spec(new))
    return {path: after.get(path, "") if text == before.get(path, "") else text
            for path, text in values.items()}


def _int(text, default=None):
    text = (text or "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        return None
