"""/api/v1/ routes."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from api import views
from api.audit import AuditEntryViewSet
from api.registry import ModelViewSet, VersionViewSet
from experiments.queries import ID_PATTERN


class Router(DefaultRouter):
    """Ids in paths are ASCII digits (`runs/+1/` and `runs/١/` are not run 1), and no action
    takes a format suffix (`runs/1/events.json`): the API answers JSON, and a suffix is a 404."""

    include_format_suffixes = False

    def get_lookup_regex(self, viewset, lookup_prefix=""):
        return f"(?P<{lookup_prefix}{viewset.lookup_url_kwarg or viewset.lookup_field}>{ID_PATTERN})"


router = Router()
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("projects", views.ProjectViewSet, basename="project")
router.register("experiments", views.ExperimentViewSet, basename="experiment")
router.register("runs", views.RunViewSet, basename="run")
router.register("tokens", views.TokenViewSet, basename="token")
router.register("invitations", views.InvitationViewSet, basename="invitation")
router.register("audit", AuditEntryViewSet, basename="audit")
router.register("models", ModelViewSet, basename="model")
router.register("model-versions", VersionViewSet, basename="model-version")

urlpatterns = [
    path("spec/schema/", views.SpecSchemaView.as_view(), name="spec-schema"),
    path("spec/presets/", views.SpecPresetsView.as_view(), name="spec-presets"),
    path("me/", views.MeView.as_view(), name="me"),
    path("me/notifications/", views.NotificationsView.as_view(), name="me-notifications"),
    *router.urls,
]
