"""GET /api/v1/audit/: the audit log for platform administrators (staff), newest first."""

from __future__ import annotations

import django_filters
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import permissions, serializers, viewsets

from api.filters import IdFilter
from api.pagination import RunCursorPagination
from api.serializers import ErrorSerializer
from audit.models import AuditEntry


class AuditEntrySerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name", help_text="Username (kept after deletion).")
    project = serializers.PrimaryKeyRelatedField(read_only=True, allow_null=True)

    class Meta:
        model = AuditEntry
        fields = ["id", "created_at", "actor", "auth_method", "action", "object_type", "object_id",
                  "object_repr", "project", "details", "ip", "user_agent", "method", "path", "status"]
        read_only_fields = fields


class AuditFilter(django_filters.FilterSet):
    actor = django_filters.CharFilter(field_name="actor_name", help_text="A username.")
    action = django_filters.CharFilter(help_text="An action such as run.cancel, or a prefix "
                                       "ending in a dot (run.) for all of its kind.",
                                       method="filter_action")
    project = IdFilter(field_name="project_id", help_text="A project id.")
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = AuditEntry
        fields = ["actor", "action", "object_type", "object_id", "project"]

    def filter_action(self, queryset, name, value):
        if value.endswith("."):
            return queryset.filter(action__startswith=value)
        return queryset.filter(action=value)


class IsStaff(permissions.BasePermission):
    message = "Only platform administrators (staff) may read the audit log."

    def has_permission(self, request, view):
        return bool(request.user and request.user.is_staff)


class AuditPagination(RunCursorPagination):
    ordering = ("-created_at", "-id")


ERRORS = {
    400: OpenApiResponse(ErrorSerializer, description="A filter's value is malformed; `errors` names it."),
    401: OpenApiResponse(ErrorSerializer, description="No valid token or session."),
    403: OpenApiResponse(ErrorSerializer, description="Only platform administrators (staff)."),
}


@extend_schema_view(
    list=extend_schema(summary="List audit entries, newest first (cursor pagination).",
                       responses={200: AuditEntrySerializer(many=True), **ERRORS}),
    retrieve=extend_schema(responses={200: AuditEntrySerializer, **ERRORS,
                                      404: OpenApiResponse(ErrorSerializer, description="No such entry.")}),
)
class AuditEntryViewSet(viewsets.ReadOnlyModelViewSet):
    """Who changed what, when and from where: writes through the API, the UI and the admin, and
    sign-in events. Read-only; staff only."""

    queryset = AuditEntry.objects.all()
    serializer_class = AuditEntrySerializer
    permission_classes = [permissions.IsAuthenticated, IsStaff]
    pagination_class = AuditPagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = AuditFilter
