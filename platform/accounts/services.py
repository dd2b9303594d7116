"""Project and membership rules, shared by the REST API and the web UI: who owns a new project,
who may manage a project's members, that people join only by accepting an invitation, and that a
project always keeps an owner."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404
from django.utils import timezone

from accounts.choices import InvitationState, Role
from accounts.models import Invitation, Membership, Project
from ascent.errors import DomainError  # the platform's one "conflicts with the state" error


def create_project(user, name: str, description: str = "") -> Project:
    """A new project with `user` as its owner (anyone signed in may create one)."""
    with transaction.atomic():
        project = Project.objects.create(name=name, description=description)
        Membership.objects.create(project=project, user=user, role=Role.OWNER)
    return project


def require_owner(project: Project, user) -> None:
    """Only owners (and staff) manage members; PermissionDenied (403) for anyone else."""
    if not project.can_admin(user):
        raise PermissionDenied("Only the project's owners may manage its members.")


def invite(project: Project, username: str, role: Role | str, invited_by) -> Invitation:
    """Offer `role` to `username`, whether or not such a user exists; a pending invitation of the
    same person is updated to the new role."""
    if project.memberships.filter(user__username=username).exists():
        raise DomainError(f"{username} is already a member; change their role instead.")
    with transaction.atomic():
        Project.objects.select_for_update().filter(pk=project.pk).first()  # one invite at a time
        pending = project.invitations.filter(state=InvitationState.PENDING)
        limit = settings.ASCENT_INVITATIONS_PENDING_MAX
        if pending.count() >= limit and not pending.filter(username=username).exists():
            raise DomainError(
                f"{project.name} already has {limit} pending invitations, the limit "
                "(ASCENT_INVITATIONS_PENDING_MAX): withdraw some, or wait until they are answered.")
        invitation, created = Invitation.objects.select_for_update().get_or_create(
            project=project, username=username, state=InvitationState.PENDING,
            defaults={"role": role, "invited_by": invited_by},
        )
        if not created:
            invitation.role, invitation.invited_by = role, invited_by
            invitation.save(update_fields=["role", "invited_by"])
    return invitation


def pending_invitations_of(user):
    """The invitations waiting for this user's answer."""
    return Invitation.objects.filter(username=user.get_username(), state=InvitationState.PENDING)


def accept(invitation: Invitation, user) -> Membership:
    """The invitee joins the project with the invited role."""
    with transaction.atomic():
        _answer(invitation, user, InvitationState.ACCEPTED)
        membership, _ = Membership.objects.get_or_create(
            project=invitation.project, user=user, defaults={"role": invitation.role})
    return membership


def decline(invitation: Invitation, user) -> None:
    _answer(invitation, user, InvitationState.DECLINED)


def withdraw(invitation: Invitation) -> None:
    """An owner takes back a pending invitation."""
    _claim(invitation, InvitationState.WITHDRAWN)


def _answer(invitation: Invitation, user, state: InvitationState) -> None:
    # Someone else's invitation does not exist as far as this user can tell.
    if invitation.username != user.get_username():
        raise Http404("No such invitation.")
    _claim(invitation, state)


def _claim(invitation: Invitation, state: InvitationState) -> None:
    """Move a pending invitation to its final state once, even under concurrent answers."""
    now = timezone.now()
    claimed = Invitation.objects.filter(pk=invitation.pk, state=InvitationState.PENDING).update(
        state=state, answered_at=now)
    if not claimed:
        invitation.refresh_from_db(fields=["state"])
        raise DomainError(f"This invitation is already {invitation.state}.")
    invitation.state, invitation.answered_at = state, now


def set_role(membership: Membership, role: Role | str) -> Membership:
    with transaction.atomic():
        _keep_an_owner(membership, new_role=role)
        membership.role = role
        membership.save(update_fields=["role"])
    return membership


def remove_member(membership: Membership) -> None:
    with transaction.atomic():
        _keep_an_owner(membership, new_role=None)
        membership.delete()


def _keep_an_owner(membership: Membership, new_role) -> None:
    """Refuse to demote or remove the last owner. The project row is locked so that two owners
    demoting each other at the same time cannot both succeed."""
    if membership.role == Role.OWNER and new_role != Role.OWNER:
        project = Project.objects.select_for_update().get(pk=membership.project_id)
        if project.memberships.filter(role=Role.OWNER).count() == 1:
            raise DomainError("A project needs an owner: make another member owner first.")
