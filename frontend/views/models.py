"""The model registry's pages: the models of your projects, one model with its versions, one
version with its lineage; and registering a run's checkpoint from the run's page."""

from __future__ import annotations

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from ascent.errors import DomainError, RequestError
from experiments.tracking import TrackingUnavailable
from frontend.views.common import run_or_404
from registry import services
from registry.models import VersionState


@login_required
def model_list(request):
    query = request.GET.get("q", "").strip()
    models = services.visible_models(request.user).prefetch_related(
        "versions", "aliases__version").distinct()
    if query:
        models = models.filter(name__icontains=query)
    rows = []
    for model in models:
        versions = list(model.versions.all())
        rows.append({"model": model, "count": len(versions),
                     "latest": max((v.version for v in versions if v.version), default=None),
                     "pending": sum(v.state == VersionState.PENDING for v in versions),
                     "aliases": sorted((a.name, a.version.version) for a in model.aliases.all())})
    return render(request, "frontend/models.html", {"section": "models", "rows": rows,
                                                    "query": query})


def _model_or_404(user, pk: int):
    model = services.visible_models(user).filter(pk=pk).first()
    if model is None:
        raise Http404(f"Model {pk} does not exist, or you are not a member of its project.")
    return model


@login_required
def model_detail(request, pk: int):
    model = _model_or_404(request.user, pk)
    versions = list(model.versions.select_related("run", "created_by").prefetch_related(
        "aliases").order_by("-id"))
    return render(request, "frontend/model.html", {
        "section": "models", "model": model, "versions": versions,
        "pending": any(v.state == VersionState.PENDING for v in versions),
        "mlflow_url": services.mlflow_url(model.name),
        "can_write": model.project.can_write(request.user)})


@login_required
def version_detail(request, pk: int, version_id: int):
    model = _model_or_404(request.user, pk)
    version = model.versions.select_related("run", "created_by").filter(pk=version_id).first()
    if version is None:
        raise Http404(f"Model {model.name} has no version {version_id}.")
    if request.method == "POST":
        return _change_version(request, model, version)
    lineage = version.lineage or {}
    return render(request, "frontend/model_version.html", {
        "section": "models", "model": model, "version": version, "lineage": lineage,
        "files": (lineage.get("data") or {}).get("files") or [],
        "synthetic": (lineage.get("data") or {}).get("synthetic"),
        "spec_yaml": yaml.safe_dump(lineage.get("spec") or version.run.spec, sort_keys=False)
        if (lineage.get("spec") or version.run.spec) else "",
        "parent": services.parent_of(version), "aliases": version.alias_names(),
        "mlflow_url": services.mlflow_url(model.name, version.version),
        "can_write": model.project.can_write(request.user)})


def _change_version(request, model, version):
    aliases = [a.strip() for a in request.POST.get("aliases", "").split(",") if a.strip()]
    try:
        services.update_version(version, request.user, aliases=aliases,
                                description=request.POST.get("description", "").strip())
    except (RequestError, DomainError, PermissionDenied) as exc:
        messages.error(request, str(exc))
    except TrackingUnavailable as exc:
        messages.error(request, exc.shown_to(request.user))
    else:
        messages.success(request, f"{version}: saved.")
    return redirect("frontend:model-version", pk=model.pk, version_id=version.pk)


@login_required
@require_POST
def run_register(request, pk: int):
    """Register the run's checkpoint (the form on the run's page) as a version of a model."""
    run = run_or_404(request.user, pk)
    step = request.POST.get("step", "").strip()
    aliases = [a.strip() for a in request.POST.get("aliases", "").split(",") if a.strip()]
    try:
        version = services.register(
            run, request.user, name=request.POST.get("name", "").strip(),
            step=int(step) if step.isdigit() else None, aliases=aliases,
            description=request.POST.get("description", "").strip())
    except (RequestError, DomainError, PermissionDenied) as exc:
        messages.error(request, f"Not registered: {exc}")
        return redirect(f"{reverse('frontend:run', args=[run.pk])}#checkpoints")
    messages.success(request, f"Run {run.pk} step {version.step}: exporting and registering as "
                              f"{version.model.name}; its version appears here when ready.")
    return redirect("frontend:model", pk=version.model_id)
