"""The settings page's notifications: your e-mails about a project's runs, and the project's
webhooks (owners add, test and delete them; the secret is shown once).

Input is checked by notifications.validation, as the REST API's is."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST
from rest_framework import serializers

from accounts import services as membership_rules
from accounts.queries import visible_projects
from notifications import services
from notifications.choices import Event, WebhookFormat
from notifications.models import STALL_DEFAULT, EmailSubscription
from frontend.views.common import errors_text
from notifications.validation import EmailSubscriptionInput, WebhookInput

# The session key that carries a new webhook's secret to the page shown next (once).
NEW_WEBHOOK = "ascent:new-webhook"
DELIVERIES_SHOWN = 5


def context(project, user) -> dict:
    """What the project's notifications section shows to `user`."""
    sub = EmailSubscription.objects.filter(user=user, project=project).first()
    hooks = list(project.webhooks.all())
    for hook in hooks:
        hook.recent = list(hook.deliveries.all()[:DELIVERIES_SHOWN])
    return {"events": Event.choices, "formats": WebhookFormat.choices, "webhooks": hooks,
            "my_events": sub.events if sub else [],
            "my_stall_minutes": sub.stall_minutes if sub else STALL_DEFAULT,
            "has_email": bool(user.email)}


def _back(project):
    return redirect(f"{reverse('frontend:settings')}#notifications-{project.name}")


@login_required
@require_POST
def email_settings(request, pk):
    """Your e-mail subscription to a project's runs (any member)."""
    project = get_object_or_404(visible_projects(request.user).distinct(), pk=pk)
    if not project.memberships.filter(user=request.user).exists():  # staff see every project
        messages.error(request, f"You are not a member of {project.name}.")
        return _back(project)
    serializer = EmailSubscriptionInput(data={
        "events": request.POST.getlist("events"),
        "stall_minutes": request.POST.get("stall_minutes") or STALL_DEFAULT})
    if not serializer.is_valid():
        messages.error(request, f"Could not save your e-mails: {errors_text(serializer)}")
        return _back(project)
    data = serializer.validated_data
    services.set_subscriptions(request.user, [{"project": project.pk, **data}])
    if data["events"]:
        where = request.user.email or "your address (none is set yet: give it above)"
        messages.success(request, f"You will get an e-mail at {where} when a run of "
                                  f"{project.name} {', '.join(e.split('.')[1] for e in data['events'])}.")
    else:
        messages.success(request, f"You will get no e-mail about {project.name}'s runs.")
    return _back(project)


@login_required
@require_POST
def webhook_create(request, pk):
    """A new webhook of the project (owners); its secret is shown on the next page only."""
    project = get_object_or_404(visible_projects(request.user).distinct(), pk=pk)
    try:
        membership_rules.require_owner(project, request.user)
    except PermissionDenied as exc:
        messages.error(request, str(exc))
        return _back(project)
    serializer = WebhookInput(data={
        "name": request.POST.get("name", ""), "url": request.POST.get("url", ""),
        "format": request.POST.get("format") or WebhookFormat.JSON,
        "events": request.POST.getlist("events"),
        "stall_minutes": request.POST.get("stall_minutes") or STALL_DEFAULT,
        "allow_local": bool(request.POST.get("allow_local"))}, context={"request": request})
    if not serializer.is_valid():
        messages.error(request, f"Could not add the webhook: {errors_text(serializer)}")
        return _back(project)
    if project.webhooks.filter(name=serializer.validated_data["name"]).exists():
        messages.error(request, "Could not add the webhook: name: the project has a webhook "
                                "of this name already.")
        return _back(project)
    hook = services.create_webhook(project, request.user, serializer.validated_data)
    request.session[NEW_WEBHOOK] = {"name": hook.name, "secret": hook.secret}
    return _back(project)


@login_required
@require_POST
def webhook_action(request, pk, webhook_id, action):
    """action=ping (a test delivery) or delete, by the project's owners."""
    project = get_object_or_404(visible_projects(request.user).distinct(), pk=pk)
    hook = get_object_or_404(project.webhooks, pk=webhook_id)
    try:
        membership_rules.require_owner(project, request.user)
    except PermissionDenied as exc:
        messages.error(request, str(exc))
        return _back(project)
    if action == "ping":
        services.ping(hook)
        messages.success(request, f"A test delivery to {hook.name} is on its way: its state "
                                  "shows below in a few seconds.")
    elif action == "delete":
        hook.delete()
        messages.success(request, f"Deleted the webhook {hook.name}.")
    else:
        messages.error(request, "Unknown webhook action: use ping or delete.")
    return _back(project)


@login_required
@require_POST
def my_email(request):
    """Your e-mail address, where notification e-mails go (empty: none)."""
    field = serializers.EmailField(allow_blank=True, max_length=254)
    try:
        email = field.run_validation(request.POST.get("email", "").strip())
    except serializers.ValidationError as exc:
        messages.error(request, f"Could not save your e-mail address: {' '.join(exc.detail)}")
    else:
        services.set_email(request.user, email)
        messages.success(request, f"Notification e-mails go to {email}." if email else
                         "You have no e-mail address: no notification e-mail can be sent.")
    return redirect(f"{reverse('frontend:settings')}#my-email")
