"""Input rules for invitations, role changes and new API tokens: one definition, used by the
REST API's serializers (which also refuse keys they do not know) and the settings page's forms.

Errors are flat: {field: [message, ...]}, never nested."""

from __future__ import annotations

from django.conf import settings
from rest_framework import serializers

from accounts.choices import Role
from accounts.models import ApiToken
from accounts.tokens import token_expiry
from ascent.errors import RequestError


class RoleInput(serializers.Serializer):
    """A member's new role."""

    role = serializers.ChoiceField(choices=Role.choices)


class InviteInput(serializers.Serializer):
    """Who to invite, with which role; the same answer whether or not the user exists."""

    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(
        choices=Role.choices,
        error_messages={"required": "Give the role to offer: owner, maintainer or viewer."},
    )


class TokenInput(serializers.ModelSerializer):
    """A new API token for the requesting user (context["request"]): its name and lifetime.
    save() issues it; the token itself is on the result as `raw`, this once."""

    expires_in_days = serializers.IntegerField(
        write_only=True, required=False, min_value=0,
        help_text=("Days until it expires, at most the server's ASCENT_TOKEN_MAX_DAYS; 0 = never, "
                   "only where that is 0. Default: ASCENT_TOKEN_DEFAULT_DAYS. A token created with "
                   "a token cannot outlive it."),
    )

    class Meta:
        model = ApiToken
        fields = ["name", "expires_in_days"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Documented as the field's maximum; the check itself (with a message naming the setting
        # and the calling token's own expiry) is accounts.tokens.token_expiry.
        self.fields["expires_in_days"].max_value = settings.ASCENT_TOKEN_MAX_DAYS or None

    def validate_name(self, name: str) -> str:
        """A name tells a user's active tokens apart: it may repeat only a revoked or expired
        token's name."""
        user = self.context["request"].user
        if ApiToken.objects.usable().filter(user=user, name=name).exists():
            raise serializers.ValidationError(
                f"You already have an active token named {name!r}: choose another name, or "
                "revoke that token first.")
        return name

    def validate(self, attrs):
        auth = getattr(self.context["request"], "auth", None)
        parent = auth if isinstance(auth, ApiToken) else None
        try:
            attrs["expires_at"] = token_expiry(attrs.pop("expires_in_days", None), parent)
        except RequestError as exc:
            raise serializers.ValidationError({exc.field: [str(exc)]}) from None
        return attrs

    def create(self, validated_data):
        auth = getattr(self.context["request"], "auth", None)
        token, raw = ApiToken.issue(self.context["request"].user, validated_data["name"],
                                    validated_data["expires_at"],
                                    parent=auth if isinstance(auth, ApiToken) else None)
        token.raw = raw
        return token

