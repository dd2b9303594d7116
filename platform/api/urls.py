"""/api/v1/ routes."""

from django.urls import path
from rest_framework.routers import DefaultRouter

from api import views
from audit.api import AuditEntryViewSet

router = DefaultRouter()
router.register("clusters", views.ClusterViewSet, basename="cluster")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("projects", views.ProjectViewSet, basename="project")
router.register("experiments", views.ExperimentViewSet, basename="experiment")
router.register("runs", views.RunViewSet, basename="run")
router.register("tokens", views.TokenViewSet, basename="token")
router.register("invitations", views.InvitationViewSet, basename="invitation")
router.register("audit", AuditEntryViewSet, basename="audit")

urlpatterns = [
    path("spec/schema/", views.SpecSchemaView.as_view(), name="spec-schema"),
    path("spec/presets/", views.SpecPresetsView.as_view(), name="spec-presets"),
    path("me/", views.MeView.as_view(), name="me"),
    *router.urls,
]
