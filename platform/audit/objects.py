"""A short description of an audited object and the project it belongs to."""

from __future__ import annotations

from accounts import models as accounts
from accounts.models import ApiToken, Membership, Project
from clusters.models import Cluster, Node
from experiments.models import Experiment, Run
from registry.models import ModelVersion, RegisteredModel

Invitation = getattr(accounts, "Invitation", None)
MODELS = {"run": Run, "experiment": Experiment, "project": Project, "member": Membership,
          "invitation": Invitation, "token": ApiToken, "cluster": Cluster, "node": Node,
          "model": RegisteredModel, "model_version": ModelVersion}


def describe(object_type: str, object_id, kwargs: dict) -> tuple[str, int | None] | None:
    """(repr, project id) of the object, or None when it does not exist (any more)."""
    describer = _DESCRIBERS.get(object_type)
    if describer is None or object_id in (None, ""):
        return None
    try:
        return describer(object_id, kwargs)
    except (ValueError, TypeError):  # an id that is not a number
        return None


def _run(pk, kwargs):
    row = Run.objects.filter(pk=int(pk)).values_list("name", "experiment__project_id").first()
    return None if row is None else (f"run {pk}" + (f" {row[0]}" if row[0] else ""), row[1])


def _experiment(pk, kwargs):
    experiment = Experiment.objects.select_related("project").filter(pk=int(pk)).first()
    return None if experiment is None else (str(experiment), experiment.project_id)


def _project(pk, kwargs):
    name = Project.objects.filter(pk=int(pk)).values_list("name", flat=True).first()
    return None if name is None else (name, int(pk))


def _member(username, kwargs):
    project = Project.objects.filter(pk=int(kwargs.get("pk"))).first()
    return None if project is None else (f"{username} in {project.name}", project.pk)


def _invitation(pk, kwargs):
    invitation = Invitation.objects.select_related("project").filter(pk=int(pk)).first()
    return None if invitation is None else (str(invitation), invitation.project_id)


def _token(pk, kwargs):
    token = ApiToken.objects.select_related("user").filter(pk=int(pk)).first()
    return None if token is None else (f"{token.name} ({token.prefix}…) of {token.user}", None)


def _cluster(pk, kwargs):
    name = Cluster.objects.filter(pk=int(pk)).values_list("name", flat=True).first()
    return None if name is None else (name, None)


def _node(pk, kwargs):
    node = Node.objects.select_related("cluster").filter(pk=int(pk)).first()
    return None if node is None else (str(node), None)


def _model(pk, kwargs):
    model = RegisteredModel.objects.filter(pk=int(pk)).first()
    return None if model is None else (f"model {model.name}", model.project_id)


def _model_version(pk, kwargs):
    version = ModelVersion.objects.select_related("model").filter(pk=int(pk)).first()
    return None if version is None else (f"{version} from run {version.run_id}",
                                         version.model.project_id)


_DESCRIBERS = {"run": _run, "experiment": _experiment, "project": _project, "member": _member,
               "invitation": _invitation, "token": _token, "cluster": _cluster, "node": _node,
               "model": _model, "model_version": _model_version}
