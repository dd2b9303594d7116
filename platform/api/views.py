"""REST API views. Each is thin: authorize, validate, act through a domain service, serialize."""

from __future__ import annotations

from django.db.models import Count
from django.shortcuts import get_object_or_404
from django.utils import timezone
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view,
                                   inline_serializer)
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.filters import OrderingFilter
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts import services as membership_rules
from accounts.choices import InvitationState
from accounts.models import ApiToken, Invitation, Project
from accounts.queries import visible_projects
from accounts.throttling import InviteThrottle, TokenCreateThrottle
from api import run_data
from api import serializers as s
from api.conditional import conditional
from api.filters import ExperimentFilter, NodeFilter
from api.pagination import RunCursorPagination
from api.permissions import IsStaffOrReadOnly, ProjectRole
from clusters.choices import NodeState
from clusters.models import Cluster, Node
from clusters.services import fitting_clusters, set_node_state
from experiments import allocation, precision, services, tracking
from experiments.filters import RunFilter
from experiments.models import Attempt, Experiment, Run
from experiments.queries import ID_MAX, parse_id, visible_runs, with_tag_names
from notifications import services as notification_services
from registry.models import ModelVersion
from rl_core.spec import PRESETS, spec_json_schema

ERRORS = {
    400: OpenApiResponse(s.ErrorSerializer, description="Invalid input; `errors` names each field."),
    403: OpenApiResponse(s.ErrorSerializer, description="Your role does not allow this."),
    404: OpenApiResponse(s.ErrorSerializer, description="No such object, or not visible to you."),
    409: OpenApiResponse(s.ErrorSerializer, description="Conflicts with the current state."),
}
TRACKING_ERRORS = {**ERRORS, 503: OpenApiResponse(s.ErrorSerializer,
                                                   description="MLflow cannot be reached.")}

# What pipelines and open pages poll: answered with an ETag, and 304 to a matching If-None-Match.
CONDITIONAL_ACTIONS = frozenset({"list", "retrieve", "metrics"})
# The run views that read rows (`QuerySet.values`) rather than runs, and what they serialize.
ROW_SERIALIZERS = {"list": s.RunListSerializer, "retrieve": s.RunRowSerializer}


# --- clusters -------------------------------------------------------------------------------

class ClusterViewSet(viewsets.ModelViewSet):
    """Registered clusters with capacity per device kind. Staff write; every user reads."""

    queryset = Cluster.objects.all()
    serializer_class = s.ClusterSerializer
    permission_classes = [IsAuthenticated, IsStaffOrReadOnly]
    filterset_fields = ["device_type", "status"]
    search_fields = ["name"]
    ordering_fields = ["name", "created_at"]

    @extend_schema(responses={200: s.UtilisationSerializer})
    @action(detail=True, methods=["get"])
    def utilisation(self, request, pk=None):
        """Devices by kind (total, healthy, held, free, held/healthy) and the runs holding them:
        yours by name, other projects' runs only as counts (`other_runs`). Staff see all."""
        return Response(run_data.utilisation(self.get_object(), request.user))


class NodeViewSet(viewsets.ModelViewSet):
    queryset = Node.objects.select_related("cluster")
    serializer_class = s.NodeSerializer
    permission_classes = [IsAuthenticated, IsStaffOrReadOnly]
    filterset_class = NodeFilter
    search_fields = ["hostname"]
    ordering_fields = ["hostname", "last_seen"]

    @extend_schema(request=None, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request, pk=None):
        """Place no new attempts on this node; running ones finish."""
        return Response(s.NodeSerializer(set_node_state(self.get_object(), NodeState.DRAINING)).data)

    @extend_schema(request=None, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def undrain(self, request, pk=None):
        """Make a drained node ready for new attempts again."""
        return Response(s.NodeSerializer(set_node_state(self.get_object(), NodeState.READY)).data)


# --- projects and members -------------------------------------------------------------------

class ProjectViewSet(viewsets.ModelViewSet):
    """Projects you are a member of. Anyone may create one and becomes its owner."""

    serializer_class = s.ProjectSerializer
    permission_classes = [IsAuthenticated, ProjectRole]
    search_fields = ["name", "description"]
    ordering_fields = ["name", "created_at"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return Project.objects.none()
        return visible_projects(self.request.user).distinct()

    def perform_create(self, serializer):
        data = serializer.validated_data
        serializer.instance = membership_rules.create_project(
            self.request.user, data["name"], data.get("description", ""))

    def perform_destroy(self, instance):
        services.delete_project(instance)

    @extend_schema(responses={200: s.MembershipSerializer(many=True)}, methods=["GET"])
    @extend_schema(request=s.InviteSerializer, methods=["POST"], responses={
        202: s.InvitationSerializer, **ERRORS,
        409: OpenApiResponse(s.ErrorSerializer, description="Already a member, or the project has "
                             "ASCENT_INVITATIONS_PENDING_MAX pending invitations."),
        429: OpenApiResponse(s.ErrorSerializer, description="Too many invitations sent "
                             "(ASCENT_INVITE_RATE); retry after Retry-After seconds.")})
    @action(detail=True, methods=["get", "post"], pagination_class=None, filter_backends=[])
    def members(self, request, pk=None):
        """List members (any member) or invite someone with a role (owners): they become a member
        when they accept. The answer is the same whether or not the username exists."""
        project = self.get_object()
        if request.method == "GET":
            memberships = project.memberships.select_related("user")
            return Response(s.MembershipSerializer(memberships, many=True).data)
        membership_rules.require_owner(project, request.user)
        serializer = s.InviteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        throttle = InviteThrottle()
        if not throttle.allow_request(request, self):
            self.throttled(request, throttle.wait())
        invitation = membership_rules.invite(project, data["username"], data["role"], request.user)
        return Response(s.InvitationSerializer(invitation).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: s.AllocationSerializer, **ERRORS}, methods=["GET"])
    @extend_schema(request=s.AllocationInputSerializer, methods=["PUT", "PATCH"],
                   responses={200: s.AllocationSerializer, **ERRORS})
    @action(detail=True, methods=["get", "put", "patch"], pagination_class=None,
            filter_backends=[], permission_classes=[IsAuthenticated])
    def allocation(self, request, pk=None):
        """The project's fair-share weight, device quotas, the devices it holds and why its
        queued runs wait (members); platform administrators (staff) change weight and quotas."""
        project = self.get_object()
        if request.method != "GET":
            if not request.user.is_staff:
                raise PermissionDenied("Only platform administrators (staff) may change a "
                                       "project's quotas and share.")
            serializer = s.AllocationInputSerializer(data=request.data)
            serializer.is_valid(raise_exception=True)
            allocation.set_allocation(project, replace=request.method == "PUT",
                                      **serializer.validated_data)
            services.notify_worker("workers.tasks.schedule_runs")
        return Response(s.AllocationSerializer(allocation.allocation(project)).data)

    @extend_schema(responses={200: s.WebhookSerializer(many=True)}, methods=["GET"])
    @extend_schema(request=s.WebhookInputSerializer, methods=["POST"],
                   responses={201: s.NewWebhookSerializer, **ERRORS})
    @action(detail=True, methods=["get", "post"], pagination_class=None, filter_backends=[])
    def webhooks(self, request, pk=None):
        """The project's webhooks (members; never their secrets), or a new one (owners): the
        answer holds its secret, shown this once."""
        project = self.get_object()
        if request.method == "GET":
            return Response(s.WebhookSerializer(project.webhooks.all(), many=True).data)
        membership_rules.require_owner(project, request.user)
        serializer = s.WebhookInputSerializer(data=request.data, context={"request": request})
        serializer.is_valid(raise_exception=True)
        if project.webhooks.filter(name=serializer.validated_data["name"]).exists():
            raise ValidationError({"name": ["The project has a webhook of this name already."]})
        hook = notification_services.create_webhook(project, request.user,
                                                    serializer.validated_data)
        return Response(s.NewWebhookSerializer(hook).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: s.WebhookSerializer, **ERRORS}, methods=["GET"])
    @extend_schema(request=s.WebhookInputSerializer, methods=["PATCH"],
                   responses={200: s.WebhookSerializer, **ERRORS})
    @extend_schema(responses={204: None, **ERRORS}, methods=["DELETE"])
    @action(detail=True, methods=["get", "patch", "delete"], filter_backends=[],
            url_path=r"webhooks/(?P<webhook_id>[0-9]+)")
    def webhook(self, request, pk=None, webhook_id=None):
        """One webhook (members); change or delete it (owners). Its secret never shows again."""
        project = self.get_object()
        hook = get_object_or_404(project.webhooks, pk=webhook_id)
        if request.method == "GET":
            return Response(s.WebhookSerializer(hook).data)
        membership_rules.require_owner(project, request.user)
        if request.method == "DELETE":
            hook.delete()
            return Response(status=status.HTTP_204_NO_CONTENT)
        serializer = s.WebhookInputSerializer(hook, data=request.data, partial=True,
                                              context={"request": request})
        serializer.is_valid(raise_exception=True)
        name = serializer.validated_data.get("name")
        if name and project.webhooks.filter(name=name).exclude(pk=hook.pk).exists():
            raise ValidationError({"name": ["The project has a webhook of this name already."]})
        hook = notification_services.update_webhook(hook, serializer.validated_data)
        return Response(s.WebhookSerializer(hook).data)

    @extend_schema(responses={200: s.DeliverySerializer(many=True), **ERRORS})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[],
            url_path=r"webhooks/(?P<webhook_id>[0-9]+)/deliveries")
    def webhook_deliveries(self, request, pk=None, webhook_id=None):
        """The webhook's last 100 deliveries, newest first, with their state, tries, last HTTP
        status and error (members)."""
        project = self.get_object()
        hook = get_object_or_404(project.webhooks, pk=webhook_id)
        return Response(s.DeliverySerializer(hook.deliveries.all()[:100], many=True).data)

    @extend_schema(request=None, responses={202: s.DeliverySerializer, **ERRORS})
    @action(detail=True, methods=["post"], filter_backends=[],
            url_path=r"webhooks/(?P<webhook_id>[0-9]+)/ping")
    def webhook_ping(self, request, pk=None, webhook_id=None):
        """Queue a test delivery (event `ping`) to the webhook (owners)."""
        project = self.get_object()
        hook = get_object_or_404(project.webhooks, pk=webhook_id)
        membership_rules.require_owner(project, request.user)
        delivery = notification_services.ping(hook)
        return Response(s.DeliverySerializer(delivery).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: s.InvitationSerializer(many=True), **ERRORS})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def invitations(self, request, pk=None):
        """The project's pending invitations (owners)."""
        project = self.get_object()
        membership_rules.require_owner(project, request.user)
        pending = project.invitations.filter(state=InvitationState.PENDING).select_related("invited_by")
        return Response(s.InvitationSerializer(pending, many=True).data)

    @extend_schema(responses={204: None, **ERRORS})
    @action(detail=True, methods=["delete"], url_path=r"invitations/(?P<invitation_id>[0-9]+)",
            filter_backends=[])
    def invitation(self, request, pk=None, invitation_id=None):
        """Withdraw a pending invitation (owners)."""
        project = self.get_object()
        membership_rules.require_owner(project, request.user)
        invitation = get_object_or_404(project.invitations, pk=invitation_id)
        membership_rules.withdraw(invitation)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=s.MembershipRoleSerializer, responses={200: s.MembershipSerializer, **ERRORS},
                   methods=["PATCH"])
    @extend_schema(responses={204: None, **ERRORS}, methods=["DELETE"])
    @action(detail=True, methods=["patch", "delete"], url_path=r"members/(?P<username>[^/]+)",
            filter_backends=[])
    def member(self, request, pk=None, username=None):
        """Change a member's role or remove them (owners). The last owner cannot leave."""
        project = self.get_object()
        membership_rules.require_owner(project, request.user)
        membership = get_object_or_404(project.memberships.select_related("user"), user__username=username)
        if request.method == "DELETE":
            membership_rules.remove_member(membership)
            return Response(status=status.HTTP_204_NO_CONTENT)
        serializer = s.MembershipRoleSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        membership = membership_rules.set_role(membership, serializer.validated_data["role"])
        return Response(s.MembershipSerializer(membership).data)


# --- experiments ----------------------------------------------------------------------------

class ExperimentViewSet(viewsets.ModelViewSet):
    serializer_class = s.ExperimentSerializer
    permission_classes = [IsAuthenticated, ProjectRole]
    filterset_class = ExperimentFilter
    search_fields = ["name", "description"]
    ordering_fields = ["name", "created_at"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Experiment.objects.none()
        return (
            Experiment.objects.filter(project__in=visible_projects(self.request.user))
            .select_related("project", "created_by")
            .annotate(run_count=Count("runs"))
            .order_by("project__name", "name")
        )

    def perform_create(self, serializer):
        data = serializer.validated_data
        serializer.instance = services.create_experiment(
            data["project"], self.request.user, data["name"], data.get("description", ""))

    def perform_destroy(self, instance):
        services.delete_experiment(instance)


# --- runs -----------------------------------------------------------------------------------

@extend_schema_view(
    list=extend_schema(summary="List runs, newest first (cursor pagination)."),
    create=extend_schema(
        summary="Submit a run",
        request=s.RunSubmitSerializer,
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
                                     description="Repeat-safe submit: the same key returns the first run.")],
        responses={201: s.RunSerializer, 200: s.RunSerializer, **ERRORS},
    ),
)
class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                 viewsets.GenericViewSet):
    """Runs of the projects you belong to. Submitting stores the run QUEUED for dispatch."""

    permission_classes = [IsAuthenticated, ProjectRole]
    pagination_class = RunCursorPagination
    filter_backends = [DjangoFilterBackend, OrderingFilter]  # `search=` is RunFilter's, as in the UI
    filterset_class = RunFilter
    ordering_fields = ["created_at", "priority"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Run.objects.none()
        if self.action in ROW_SERIALIZERS:  # rows, not runs: see serializers.FromRows
            return visible_runs(self.request.user).values(*ROW_SERIALIZERS[self.action].columns())
        return (visible_runs(self.request.user)
                .select_related("experiment", "created_by", "cluster").prefetch_related("tags"))

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if self.action in CONDITIONAL_ACTIONS:
            return conditional(request, response)
        return response

    def list(self, request, *args, **kwargs):
        page = with_tag_names(self.paginate_queryset(self.filter_queryset(self.get_queryset())))
        return self.get_paginated_response(s.RunListSerializer(page, many=True).data)

    def retrieve(self, request, *args, **kwargs):
        [run] = with_tag_names([self.get_object()])
        attempts = (Attempt.objects.filter(run_id=run["id"])
                    .values(*s.AttemptRowSerializer.columns()))
        run["attempts"] = s.AttemptRowSerializer(attempts, many=True).data
        versions = ModelVersion.objects.filter(run_id=run["id"]).select_related("model")
        run["model_versions"] = s.RunModelVersionSerializer(versions.order_by("id"),
                                                            many=True).data
        return Response(s.RunRowSerializer(run).data)

    def filter_queryset(self, queryset):
        if not self.request.query_params:  # no filter, search or ordering asked for
            return queryset  # skips building the filter form of every request
        return super().filter_queryset(queryset)

    def get_serializer_class(self):
        return {"list": s.RunListSerializer, "create": s.RunSubmitSerializer}.get(self.action, s.RunSerializer)

    def create(self, request, *args, **kwargs):
        serializer = s.RunSubmitSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        experiment = data["experiment"]
        if not experiment.project.can_write(request.user):
            raise PermissionDenied("Viewers cannot submit runs: ask an owner for the maintainer role.")
        submission = services.Submission(
            spec=data["spec"], overrides=data["overrides"], name=data["name"],
            priority=data["priority"], max_restarts=data["max_restarts"],
            preemptible=data["preemptible"],
            cluster=data.get("cluster"), idempotency_key=_idempotency_key(request),
            ignore_memory_plan=data["ignore_memory_plan"],
        )
        run, created = services.submit_run(experiment, request.user, submission)
        return Response(s.RunSerializer(run).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(summary="Change a run's tags or note", request=s.RunNotesSerializer,
                   responses={200: s.RunSerializer, **ERRORS})
    def partial_update(self, request, pk=None):
        """Replace the run's tags and/or its note, in any state (owners and maintainers); a key
        left out keeps what the run has. MLflow's copy (the run's description and its
        `ascent.tags` tag) follows within seconds."""
        run = self.get_object()
        serializer = s.RunNotesSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        run = services.annotate_run(run, **serializer.validated_data)
        return Response(s.RunSerializer(run).data)

    @extend_schema(request=s.RunValidateSerializer,
                   responses={200: s.ValidationResultSerializer, 400: ERRORS[400]})
    @action(detail=False, methods=["post"])
    def validate(self, request):
        """Dry run: validate a spec and show the resolved spec, device request and memory plan.
        Stores nothing."""
        serializer = s.RunValidateSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        prepared = services.prepare(services.Submission(
            spec=data["spec"], overrides=data["overrides"], cluster=data.get("cluster")))
        services.check_spec(prepared.spec, None, request.user)  # models:/ paths, for one
        device_request = prepared.spec.device_request()
        memory = prepared.memory
        return Response({
            "valid": True,
            "spec": prepared.spec.model_dump(mode="json"),
            "device_request": device_request,
            "clusters": fitting_clusters(device_request, data.get("cluster")),
            "memory_plan": memory.to_dict(),
            "memory_plan_reason": memory.reason,
        })

    @extend_schema(request=None, responses={200: s.RunSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel: at once if not yet launched, else CANCELLING until the job stops. 409 if finished."""
        run = services.cancel_run(self.get_object(), request.user)
        return Response(s.RunSerializer(run).data)

    @extend_schema(request=s.CloneSerializer, responses={201: s.RunSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def clone(self, request, pk=None):
        """A new QUEUED run with this run's spec, optionally with dotted overrides."""
        run = self.get_object()
        serializer = s.CloneSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        clone = services.clone_run(run, request.user, **serializer.validated_data)
        return Response(s.RunSerializer(clone).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={201: s.RunSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def restart(self, request, pk=None):
        """A new QUEUED run continuing a FAILED or CANCELLED run from its latest checkpoint."""
        restart = services.restart_run(self.get_object(), request.user)
        return Response(s.RunSerializer(restart).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: s.RunEventSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def events(self, request, pk=None):
        """Every state change of the run, oldest first."""
        run = self.get_object()
        return Response(s.RunEventSerializer(run.events.all(), many=True).data)

    @extend_schema(
        parameters=[
            OpenApiParameter("attempt", {"type": "integer", "minimum": 1,
                                         "maximum": run_data.ATTEMPT_MAX},
                             description="Attempt number (default: the latest)."),
            OpenApiParameter("offset", {"type": "integer", "minimum": 0,
                                        "maximum": run_data.OFFSET_MAX},
                             description="Characters already read (default 0)."),
            OpenApiParameter("follow", bool, description="Stream server-sent events (`log`, "
                             "then `end`) as the log grows; also with Accept: text/event-stream. "
                             "At most ASCENT_LOG_STREAMS_PER_USER streams per user at once (429 "
                             "with Retry-After beyond); a stream ends after "
                             "ASCENT_LOG_STREAM_LIMIT_S: reconnect with the offset of `end`."),
        ],
        responses={200: s.LogPageSerializer, **ERRORS,
                   429: OpenApiResponse(s.ErrorSerializer, description="Too many open log "
                                        "streams; retry after Retry-After seconds.")})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[],
            renderer_classes=[JSONRenderer, BrowsableAPIRenderer, run_data.EventStreamRenderer])
    def logs(self, request, pk=None):
        """The training job's log (stdout and stderr), read incrementally by offset."""
        run = self.get_object()
        follow = request.query_params.get("follow", "") in ("1", "true", "yes")
        if follow or "text/event-stream" in request.headers.get("Accept", ""):
            return run_data.follow_logs(run, request)
        return Response(run_data.log_page(run, request.query_params))

    @extend_schema(
        parameters=[
            OpenApiParameter("keys", str, description="Comma-separated metric names to return "
                             "histories of, e.g. reward/mean,actor/kl_loss."),
            OpenApiParameter("max_points", {"type": "integer", "minimum": 2,
                                            "maximum": run_data.MAX_POINTS_MAX},
                             description="Points per history, evenly "
                             "down-sampled keeping the first and last (default 500)."),
        ],
        responses={200: s.MetricsSerializer, **TRACKING_ERRORS})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def metrics(self, request, pk=None):
        """Metrics of the run from MLflow: names, latest values and histories for charts."""
        return Response(run_data.metrics(self.get_object(), request.query_params))

    @extend_schema(
        parameters=[
            OpenApiParameter("against", {"type": "integer", "minimum": 1, "maximum": ID_MAX},
                             required=True, description="The reference run (A): this run's "
                             "dumps are checked against its."),
            OpenApiParameter("cosine_min", float, description="Lowest cosine similarity that "
                             "passes (full tensors; default 0.9999)."),
            OpenApiParameter("abs_max", float, description="Absolute error that passes "
                             "(default 1e-5)."),
            OpenApiParameter("rel_max", float, description="Relative error that passes "
                             "(default 1e-3); an error passes under either."),
        ],
        responses={200: OpenApiResponse(OpenApiTypes.OBJECT, description=(
            "The comparison report (as `python -m rl_core precision compare` writes it): "
            "`summary`, `diverged`, `first_divergence`, `thresholds`, `only_in_a`, "
            "`only_in_b` and every compared tensor in `rows`.")), **TRACKING_ERRORS})
    @action(detail=True, methods=["get"], url_path="precision", pagination_class=None,
            filter_backends=[])
    def precision_report(self, request, pk=None):
        """The precision comparison of this run's dumps (`tools.precision`) against the
        reference run `against`: where they part first. 409 when either has no dumps."""
        run = self.get_object()
        against = parse_id(request.query_params.get("against"))
        if against is None:
            raise services.RequestError("against", "Give the reference run's id, e.g. "
                                                   "?against=12.")
        reference = self.get_queryset().filter(pk=against).first()
        if reference is None:
            raise services.RequestError("against", f"Run {against} does not exist, or you are "
                                                   "not a member of its project.")
        thresholds, errors = precision.Thresholds.from_params(request.query_params)
        if errors:
            raise ValidationError({name: [message] for name, message in errors.items()})
        return Response(precision.compare_runs(reference, run, thresholds))

    @extend_schema(responses={200: s.ArtifactSerializer(many=True), **TRACKING_ERRORS})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def artifacts(self, request, pk=None):
        """The run's artifacts in MLflow (checkpoints/step_N, ...), with the MLflow link."""
        return Response(tracking.artifacts(self.get_object()))


def _idempotency_key(request) -> str:
    key = request.headers.get("Idempotency-Key", "").strip()
    if len(key) > 128:
        raise services.RequestError("Idempotency-Key", "Use at most 128 characters.")
    return key


# --- the run spec ---------------------------------------------------------------------------

class SpecSchemaView(APIView):
    """The RunSpec JSON Schema: what the submit form and pipelines build specs from."""

    @extend_schema(responses={200: OpenApiResponse(
        OpenApiTypes.OBJECT, description="A JSON Schema (draft 2020-12) document of RunSpec.")})
    def get(self, request):
        return Response(spec_json_schema())


class SpecPresetsView(APIView):
    """Per-algorithm defaults that fill every field a submitted spec leaves out."""

    @extend_schema(responses={200: inline_serializer("SpecPresets", {
        name: serializers.JSONField(help_text=f"The {name} preset: a partial RunSpec.")
        for name in PRESETS})})
    def get(self, request):
        return Response(PRESETS)


# --- tokens ---------------------------------------------------------------------------------

@extend_schema_view(
    create=extend_schema(responses={
        201: s.NewTokenSerializer, 400: ERRORS[400],
        429: OpenApiResponse(s.ErrorSerializer, description="Too many new tokens "
                             "(ASCENT_TOKEN_CREATE_RATE); retry after Retry-After seconds.")}),
    destroy=extend_schema(summary="Revoke a token (it stays listed, inactive)."),
)
class TokenViewSet(mixins.ListModelMixin, mixins.CreateModelMixin, mixins.RetrieveModelMixin,
                   mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Your API tokens. The token itself is returned once, at creation; only its hash is kept."""

    serializer_class = s.TokenSerializer

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ApiToken.objects.none()
        return ApiToken.objects.filter(user=self.request.user)

    def get_throttles(self):
        throttles = super().get_throttles()
        return [*throttles, TokenCreateThrottle()] if self.action == "create" else throttles

    def create(self, request, *args, **kwargs):
        serializer = s.TokenSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        token = serializer.save()
        return Response(s.NewTokenSerializer(token).data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        instance.revoke()


class InvitationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Invitations waiting for your answer: accept one to join its project, or decline it."""

    serializer_class = s.InvitationSerializer
    pagination_class = None
    filter_backends = []

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Invitation.objects.none()
        return membership_rules.pending_invitations_of(self.request.user).select_related(
            "project", "invited_by")

    @extend_schema(request=None, responses={200: s.MembershipSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def accept(self, request, pk=None):
        membership = membership_rules.accept(self.get_object(), request.user)
        return Response(s.MembershipSerializer(membership).data)

    @extend_schema(request=None, responses={200: s.InvitationSerializer, **ERRORS})
    @action(detail=True, methods=["post"])
    def decline(self, request, pk=None):
        invitation = self.get_object()
        membership_rules.decline(invitation, request.user)
        return Response(s.InvitationSerializer(invitation).data)


class NotificationsView(APIView):
    """Your e-mail notifications: per project you are a member of, the events of its runs you
    want an e-mail about (to your account's address) and the stall threshold."""

    @extend_schema(responses={200: s.EmailSubscriptionSerializer(many=True)})
    def get(self, request):
        return Response(notification_services.subscriptions_of(request.user))

    @extend_schema(request=s.EmailSubscriptionSerializer(many=True),
                   responses={200: s.EmailSubscriptionSerializer(many=True), **ERRORS})
    def put(self, request):
        """Set the subscriptions of the projects named (an empty `events` list: none); other
        projects keep theirs."""
        serializer = s.EmailSubscriptionSerializer(data=request.data, many=True)
        serializer.is_valid(raise_exception=True)
        mine = set(request.user.memberships.values_list("project_id", flat=True))
        for index, item in enumerate(serializer.validated_data):
            if item["project"] not in mine:
                raise ValidationError({f"{index}.project": [
                    f"You are not a member of project {item['project']}."]})
        notification_services.set_subscriptions(request.user, serializer.validated_data)
        return Response(notification_services.subscriptions_of(request.user))


class MeView(APIView):
    """Who the request is authenticated as."""

    @extend_schema(responses={200: s.MeSerializer})
    def get(self, request):
        return Response(self._me(request.user))

    @extend_schema(request=s.MeInputSerializer, responses={200: s.MeSerializer, **ERRORS})
    def patch(self, request):
        """Change your e-mail address (where notification e-mails go)."""
        serializer = s.MeInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if "email" in serializer.validated_data:
            notification_services.set_email(request.user, serializer.validated_data["email"])
        return Response(self._me(request.user))

    @staticmethod
    def _me(user) -> dict:
        return {
            "username": user.get_username(),
            "email": user.email,
            "is_staff": user.is_staff,
            "projects": [
                {"id": m.project_id, "name": m.project.name, "role": m.role}
                for m in user.memberships.select_related("project")
            ],
            "server_time": timezone.now(),
        }


