"""Projects, their members, invitations to join them and API tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from accounts.choices import ADMIN_ROLES, WRITE_ROLES, InvitationState, Role
from ascent.validators import plain_text

TOKEN_PREFIX = "asc_"
# A project's fair-share weight: its runs are entitled to devices in proportion to it.
SHARE_WEIGHT_MIN, SHARE_WEIGHT_MAX, SHARE_WEIGHT_DEFAULT = 0.01, 1000.0, 1.0

slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{0,62}$",
    "Use 1-63 lowercase letters, digits and hyphens, starting with a letter or digit.",
)


class Project(models.Model):
    """A team's space: experiments, runs and who may see or change them."""

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    description = models.TextField(blank=True)
    share_weight = models.FloatField(
        default=SHARE_WEIGHT_DEFAULT,
        validators=[MinValueValidator(SHARE_WEIGHT_MIN), MaxValueValidator(SHARE_WEIGHT_MAX)],
        help_text="Fair-share weight (platform administrators set it): among waiting runs, the "
                  "project furthest below its weighted share of the devices goes first.")
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="projects"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def role_of(self, user) -> Role | None:
        """The user's role here, or None for a stranger (staff count as owners)."""
        if not user or not user.is_authenticated:
            return None
        if user.is_staff:
            return Role.OWNER
        role = self.memberships.filter(user=user).values_list("role", flat=True).first()
        return Role(role) if role else None

    def can_write(self, user) -> bool:
        return self.role_of(user) in WRITE_ROLES

    def can_admin(self, user) -> bool:
        return self.role_of(user) in ADMIN_ROLES


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project", "user__username"]
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="unique_project_member")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class Invitation(models.Model):
    """An owner's offer of a role to a username; it becomes a membership only when accepted.
    The username need not exist, so an invitation tells the owner nothing about who has an account."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="invitations")
    username = models.CharField(max_length=150)
    role = models.CharField(max_length=16, choices=Role.choices)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    state = models.CharField(
        max_length=16, choices=InvitationState.choices, default=InvitationState.PENDING
    )
    created_at = models.DateTimeField(auto_now_add=True)
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "username"], condition=models.Q(state="pending"),
                name="one_pending_invitation_per_user",
            )
        ]

    def __str__(self) -> str:
        return f"{self.username} to {self.project} as {self.role} ({self.state})"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet):
    def usable(self):
        now = timezone.now()
        return self.filter(revoked_at__isnull=True).filter(
            models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now)
        )


class ApiToken(models.Model):
    """A bearer token. Only its SHA-256 is stored; the token itself is shown once, at creation."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, validators=[plain_text])
    prefix = models.CharField(max_length=12, help_text="The first characters, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="minted",
        help_text="The token whose request created this one: revoking it revokes this one.")

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) of {self.user}"

    @classmethod
    def issue(cls, user, name: str, expires_at=None,
              parent: ApiToken | None = None) -> tuple[ApiToken, str]:
        """Create a token (`parent`: the token whose request creates it); returns the row and
        the raw token, which is never stored."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, prefix=raw[:12], key_hash=hash_token(raw),
                                   expires_at=expires_at, parent=parent)
        return token, raw

    @property
    def is_active(self) -> bool:
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > timezone.now()

    def revoke(self) -> None:
        """Revoke this token and every token minted with it, at any depth: a stolen token
        cannot outlive its revocation through the tokens it made."""
        now = timezone.now()
        family, generation = [self.pk], [self.pk]
        while generation:
            generation = list(ApiToken.objects.filter(parent_id__in=generation)
                              .values_list("pk", flat=True))
            family += generation
        ApiToken.objects.filter(pk__in=family, revoked_at__isnull=True).update(revoked_at=now)
        if self.revoked_at is None:
            self.revoked_at = now
