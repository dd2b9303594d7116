"""The audit log in the Django admin: read-only."""

from django.contrib import admin

from audit.models import AuditEntry


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    list_display = ["created_at", "actor_name", "auth_method", "action", "object_type", "object_id",
                    "object_repr", "project", "ip", "status"]
    list_filter = ["action", "object_type"]
    search_fields = ["actor_name", "action", "object_repr", "object_id", "path"]
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
