"""Settings: your projects (new ones, their experiments and members), invitations to join one,
and your API tokens.

Input is checked by accounts.validation and the throttle of accounts.throttling, and the rules
are applied by accounts.services: the same code as the REST API's, so the page and the API accept
and refuse the same things.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Prefetch
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from accounts import services as membership_rules
from accounts.choices import InvitationState, Role
from accounts.models import ApiToken, Invitation, Membership
from accounts.queries import visible_projects
from accounts.throttling import InviteThrottle, TokenCreateThrottle
from accounts.validation import InviteInput, RoleInput, TokenInput
from ascent.errors import DomainError, RequestError
from clusters.choices import DeviceKind
from experiments import allocation
from experiments.choices import WaitingCause
from experiments.models import Experiment
from experiments.queries import parse_id
from experiments.services import create_experiment, notify_worker
from experiments.validation import AllocationInput
from frontend.forms import ExperimentForm, ProjectForm
from frontend.views.common import errors_text
from frontend.views import notifications


def _page(request, status=200, experiment_form=None, **extra):
    """The settings page; `experiment_form`: (project id, a bound ExperimentForm with errors)."""
    projects = list(visible_projects(request.user).distinct().prefetch_related(
        Prefetch("memberships", Membership.objects.select_related("user").order_by("user__username")),
        Prefetch("experiments", Experiment.objects.annotate(run_count=Count("runs")).order_by("name"))))
    healthy = allocation.healthy_devices()
    for project in projects:
        project.allocation = _allocation(project, healthy)
        project.notify = notifications.context(project, request.user)
        project.manageable = project.can_admin(request.user)
        project.writable = project.can_write(request.user)
        project.pending = (project.invitations.filter(state=InvitationState.PENDING)
                           if project.manageable else [])
        project.experiment_form = (experiment_form[1] if experiment_form and experiment_form[0] == project.pk
                                   else ExperimentForm())
    context = {
        "projects": projects, "roles": Role.choices, "project_form": ProjectForm(),
        "invitations": membership_rules.pending_invitations_of(request.user).select_related(
            "project", "invited_by"),
        "tokens": ApiToken.objects.filter(user=request.user),
        "default_days": settings.ASCENT_TOKEN_DEFAULT_DAYS,
        "max_days": settings.ASCENT_TOKEN_MAX_DAYS,
        "token_form": {"name": "", "expires_in_days": settings.ASCENT_TOKEN_DEFAULT_DAYS},
        **extra,
    }
    return render(request, "frontend/settings.html", context, status=status)


def _allocation(project, healthy: dict[str, int]) -> dict:
    """allocation.allocation plus a row per device kind the platform has or the project uses,
    and the waiting causes by their labels."""
    shown = allocation.allocation(project, healthy)
    kinds = [k for k in DeviceKind.values
             if healthy.get(k) or k in shown["quotas"] or shown["held"].get(k)]
    shown["rows"] = [{"kind": k, "quota": shown["quotas"].get(k), "held": shown["held"].get(k, 0),
                      "healthy": healthy.get(k, 0)} for k in kinds]
    shown["waiting_causes"] = [(WaitingCause(cause).label, n)
                               for cause, n in sorted(shown["waiting"].items())]
    return shown


@login_required
@require_POST
def project_allocation(request, pk):
    """A project's fair-share weight and device quotas (platform administrators only): one
    field per device kind, empty for no limit; the same rules as the API's PUT."""
    project = get_object_or_404(visible_projects(request.user).distinct(), pk=pk)
    back = redirect(f"{reverse('frontend:settings')}#project-{project.name}")
    if not request.user.is_staff:
        messages.error(request, "Only platform administrators (staff) may change a project's "
                                "quotas and share.")
        return back
    quotas = {kind: request.POST[f"quota_{kind}"].strip() or None
              for kind in DeviceKind.values if f"quota_{kind}" in request.POST}
    serializer = AllocationInput(data={"share_weight": request.POST.get("share_weight", ""),
                                       "quotas": quotas})
    if not serializer.is_valid():
        messages.error(request, f"Could not change {project.name}'s devices: "
                                f"{errors_text(serializer)}")
        return back
    allocation.set_allocation(project, replace=True, **serializer.validated_data)
    notify_worker("workers.tasks.schedule_runs")
    messages.success(request, f"Saved {project.name}'s quotas and fair-share weight; they apply "
                              "to the runs admitted from now on.")
    return back


@login_required
@require_POST
def project_create(request):
    """A new project with the user as its owner (anyone signed in may create one)."""
    form = ProjectForm(request.POST)
    if not form.is_valid():
        return _page(request, status=400, project_form=form, project_open=True)
    project = membership_rules.create_project(request.user, **form.cleaned_data)
    messages.success(request, f"Created the project {project.name}; you are its owner. Add an "
                              "experiment to it to submit runs.")
    return redirect(f"{reverse('frontend:settings')}#project-{project.name}")


@login_required
@require_POST
def experiment_create(request, pk):
    """A new experiment in one of the user's projects (owners and maintainers)."""
    project = get_object_or_404(visible_projects(request.user).distinct(), pk=pk)
    back = f"{reverse('frontend:settings')}#project-{project.name}"
    form = ExperimentForm(request.POST)
    if form.is_valid():
        try:
            experiment = create_experiment(project, request.user, **form.cleaned_data)
        except PermissionDenied as exc:
            messages.error(request, str(exc))
            return redirect(back)
        except RequestError as exc:
            form.add_error(exc.field, str(exc))
        else:
            messages.success(request, f"Created the experiment {project.name}/{experiment.name}: "
                                      "runs can be submitted to it now.")
            return redirect(back)
    return _page(request, status=400, experiment_form=(project.pk, form))


# The session key that carries a new token from its POST to the page the browser is sent to
# (post/redirect/get): shown by that one GET and gone, so a reload creates and shows nothing.
NEW_TOKEN = "ascent:new-token"


@login_required
def settings_page(request):
    return _page(request, new_token=request.session.pop(NEW_TOKEN, None),
                 new_webhook=request.session.pop(notifications.NEW_WEBHOOK, None))


@login_required
@require_POST
def member_action(request, pk):
    """op=add (username, role: an invitation), op=withdraw (invitation), op=role (username, role)
    or op=remove (username); owners only."""
    project = get_object_or_404(visible_projects(request.user).distinct(), pk=pk)
    back = redirect(f"{reverse('frontend:settings')}#project-{project.name}")
    op, username = request.POST.get("op"), request.POST.get("username", "").strip()
    try:
        membership_rules.require_owner(project, request.user)
        if op == "add":
            return _invite(request, project, username, back)
        if op == "withdraw":
            invitation_id = request.POST.get("invitation", "")
            invitation = get_object_or_404(
                project.invitations, pk=parse_id(invitation_id) or 0)
            membership_rules.withdraw(invitation)
            messages.success(request, f"Withdrew the invitation of {invitation.username}.")
            return back
        membership = project.memberships.filter(user__username=username).first()
        if membership is None:
            messages.error(request, f"{username or 'That user'} is not a member of {project.name}.")
        elif op == "role":
            serializer = RoleInput(data={"role": request.POST.get("role")})
            if not serializer.is_valid():
                messages.error(request, f"Could not change the role of {username}: {errors_text(serializer)}")
                return back
            membership_rules.set_role(membership, serializer.validated_data["role"])
            messages.success(request, f"{username} is now {membership.role} of {project.name}.")
        elif op == "remove":
            membership_rules.remove_member(membership)
            messages.success(request, f"Removed {username} from {project.name}.")
        else:
            messages.error(request, "Unknown member action: use add, role or remove.")
    except (PermissionDenied, DomainError) as exc:
        messages.error(request, str(exc))
    return back


def _invite(request, project, username, back):
    serializer = InviteInput(data={"username": username, "role": request.POST.get("role")})
    if not serializer.is_valid():
        messages.error(request, f"Could not invite {username or 'anyone'}: {errors_text(serializer)}")
        return back
    data = serializer.validated_data
    throttle = InviteThrottle()
    if not throttle.allow_request(request, None):
        minutes = max(1, round(throttle.wait() / 60))
        messages.error(request, f"Could not invite {username}: too many invitations sent; try "
                                f"again in {minutes} minutes.")
        return back
    membership_rules.invite(project, data["username"], data["role"], request.user)
    messages.success(request, f"Invited {username} to {project.name} as {data['role']}: "
                              "they become a member when they accept.")
    return back


@login_required
@require_POST
def invitation_answer(request, pk, answer):
    """answer=accept or decline, by the invited user only (anyone else gets a 404)."""
    invitation = get_object_or_404(Invitation.objects.select_related("project"), pk=pk)
    try:
        if answer == "accept":
            membership_rules.accept(invitation, request.user)
            messages.success(request, f"You joined {invitation.project.name} as {invitation.role}.")
        elif answer == "decline":
            membership_rules.decline(invitation, request.user)
            messages.success(request, f"Declined the invitation to {invitation.project.name}.")
        else:
            raise Http404("Answer an invitation with accept or decline.")
    except DomainError as exc:
        messages.error(request, str(exc))
    return redirect(f"{reverse('frontend:settings')}#invitations")


@login_required
@require_POST
def token_create(request):
    """Issue a token and show it on the page this once: only its hash is kept."""
    serializer = TokenInput(data=request.POST, context={"request": request})
    throttle = TokenCreateThrottle()
    if not throttle.allow_request(request, None):
        minutes = max(1, round(throttle.wait() / 60))
        errors = {"name": [f"Too many new tokens: try again in {minutes} minutes."]}
        return _page(request, token_form=request.POST, token_errors=errors, status=429)
    if not serializer.is_valid():
        form = {"name": request.POST.get("name", ""),
                "expires_in_days": request.POST.get("expires_in_days", "")}
        return _page(request, token_form=form, token_errors=serializer.errors)
    token = serializer.save()
    request.session[NEW_TOKEN] = {"name": token.name, "raw": token.raw}
    return redirect(f"{reverse('frontend:settings')}#tokens")


@login_required
@require_POST
def token_revoke(request, pk):
    token = get_object_or_404(ApiToken, pk=pk, user=request.user)
    token.revoke()
    messages.success(request, f"Revoked the token {token.name} ({token.prefix}…): it no longer works.")
    return redirect(f"{reverse('frontend:settings')}#tokens")
