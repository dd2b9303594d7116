"""Enumerations of the accounts app."""

from django.db import models


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    MAINTAINER = "maintainer", "Maintainer"
    VIEWER = "viewer", "Viewer"


# Roles allowed to create and act on a project's experiments and runs.
WRITE_ROLES = frozenset({Role.OWNER, Role.MAINTAINER})
# Roles allowed to change the project itself and its membership.
ADMIN_ROLES = frozenset({Role.OWNER})


class InvitationState(models.TextChoices):
    PENDING = "pending", "Pending"
    ACCEPTED = "accepted", "Accepted"
    DECLINED = "declined", "Declined"
    WITHDRAWN = "withdrawn", "Withdrawn"
