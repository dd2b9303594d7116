"""The web UI's pages (mounted at the site root)."""

from django.contrib.auth import views as auth_views
from django.urls import path

from frontend.views import (
    audit,
    clusters,
    compare,
    dashboard,
    notifications,
    precision,
    runs,
    settings,
    submit,
)

app_name = "frontend"

urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("sign-in/", auth_views.LoginView.as_view(template_name="frontend/sign_in.html",
                                                  redirect_authenticated_user=True), name="sign-in"),
    path("sign-out/", auth_views.LogoutView.as_view(), name="sign-out"),
    path("runs/", runs.run_list, name="runs"),
    path("runs/new/", submit.submit, name="submit"),
    path("runs/new/convert/", submit.convert, name="submit-convert"),
    path("runs/<int:pk>/", runs.run_detail, name="run"),
    path("runs/<int:pk>/status/", runs.run_status, name="run-status"),
    path("runs/<int:pk>/checkpoints/", runs.run_checkpoints, name="run-checkpoints"),
    path("runs/<int:pk>/tools/", runs.run_tools, name="run-tools"),
    path("runs/<int:pk>/log.txt", runs.run_log, name="run-log"),
    path("runs/<int:pk>/samples/", runs.run_samples, name="run-samples"),
    path("runs/<int:pk>/samples/picture", runs.run_sample_picture, name="run-sample-picture"),
    path("runs/<int:pk>/notes/", runs.run_notes, name="run-notes"),
    path("runs/<int:pk>/cancel/", runs.run_cancel, name="run-cancel"),
    path("runs/<int:pk>/restart/", runs.run_restart, name="run-restart"),
    path("compare/", compare.compare, name="compare"),
    path("compare/precision/", precision.precision_compare, name="precision-compare"),
    path("clusters/", clusters.cluster_list, name="clusters"),
    path("audit/", audit.audit_log, name="audit"),
    path("clusters/nodes/<int:pk>/<str:action>/", clusters.node_action, name="node-action"),
    path("settings/", settings.settings_page, name="settings"),
    path("settings/projects/new/", settings.project_create, name="project-create"),
    path("settings/projects/<int:pk>/experiments/", settings.experiment_create,
         name="experiment-create"),
    path("settings/projects/<int:pk>/allocation/", settings.project_allocation,
         name="project-allocation"),
    path("settings/email/", notifications.my_email, name="my-email"),
    path("settings/projects/<int:pk>/email/", notifications.email_settings,
         name="email-settings"),
    path("settings/projects/<int:pk>/webhooks/", notifications.webhook_create,
         name="webhook-create"),
    path("settings/projects/<int:pk>/webhooks/<int:webhook_id>/<str:action>/",
         notifications.webhook_action, name="webhook-action"),
    path("settings/projects/<int:pk>/members/", settings.member_action, name="member-action"),
    path("settings/invitations/<int:pk>/<str:answer>/", settings.invitation_answer,
         name="invitation-answer"),
    path("settings/tokens/", settings.token_create, name="token-create"),
    path("settings/tokens/<int:pk>/revoke/", settings.token_revoke, name="token-revoke"),
]
