"""Which projects a user sees, for the REST API and the web UI alike."""

from __future__ import annotations

from django.db.models import QuerySet

from accounts.models import Project


def visible_projects(user) -> QuerySet[Project]:
    """The projects the user is a member of; staff see every project."""
    if user.is_staff:
        return Project.objects.all()
    return Project.objects.filter(memberships__user=user)
