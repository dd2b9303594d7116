"""Membership rules, shared by the REST API and the web UI: who may manage a project's members,
and that a project always keeps an owner."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db import transaction

from accounts.choices import Role
from accounts.models import Membership, Project
from experiments.services import DomainError  # the platform's one "conflicts with the state" error


def require_owner(project: Project, user) -> None:
    """Only owners (and staff) manage members; PermissionDenied (403) for anyone else."""
    if not project.can_admin(user):
        raise PermissionDenied("Only the project's owners may manage its members.")


def add_member(project: Project, user, role: Role | str) -> Membership:
    if project.memberships.filter(user=user).exists():
        raise DomainError(f"{user.username} is already a member; change their role instead.")
    return Membership.objects.create(project=project, user=user, role=role)


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
