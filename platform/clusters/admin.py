from django.contrib import admin

from clusters.models import Cluster, Node
from clusters.services import cluster_capacity


class NodeInline(admin.TabularInline):
    model = Node
    extra = 0
    fields = ["hostname", "device_type", "device_count", "healthy_device_count", "state", "last_seen"]


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    list_display = ["name", "device_type", "status", "ray_address", "free_devices", "last_probe_at"]
    list_filter = ["device_type", "status", "allow_trust_remote_code"]
    search_fields = ["name", "ray_address"]
    fieldsets = [
        (None, {"fields": ["name", "device_type", "ray_address", "status", "labels",
                           "last_probe_at", "last_probe_error"]}),
        ("Path policy (empty roots: no restriction)", {"fields": [
            "model_roots", "data_roots", "output_roots", "allow_trust_remote_code"]}),
    ]
    inlines = [NodeInline]

    @admin.display(description="free / healthy")
    def free_devices(self, obj):
        return ", ".join(
            f"{kind}: {cap.free}/{cap.healthy}" for kind, cap in cluster_capacity(obj).items()
        ) or "-"


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["hostname", "cluster", "device_type", "device_count", "healthy_device_count", "state", "last_seen"]
    list_filter = ["cluster", "device_type", "state"]
    search_fields = ["hostname", "address"]
    actions = ["drain", "undrain"]

    @admin.action(description="Drain: place no new attempts on these nodes")
    def drain(self, request, queryset):
        queryset.update(state="draining")

    @admin.action(description="Undrain: make these nodes ready again")
    def undrain(self, request, queryset):
        queryset.update(state="ready")
