"""The model registry's API: /api/v1/models/ and /api/v1/model-versions/.

A version is asked for with POST /model-versions/ (a run and a model name; the step defaults to
the run's latest checkpoint) and answered 202 while the worker exports and registers it; it is
ready when its `state` is `ready`, and then `models:/<name>/<version>` starts a run from it.
"""

from __future__ import annotations

import django_filters
from django.shortcuts import get_object_or_404
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_field, \
    extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.filters import SearchFilter
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from api.filters import IdFilter
from api.serializers import ErrorSerializer
from api.strict import StrictSerializer
from experiments.queries import visible_runs
from registry import services
from registry.models import ModelVersion, RegisteredModel

ERRORS = {
    400: OpenApiResponse(ErrorSerializer, description="Invalid input; `errors` names each field."),
    403: OpenApiResponse(ErrorSerializer, description="Your role does not allow this."),
    404: OpenApiResponse(ErrorSerializer, description="No such object, or not visible to you."),
    409: OpenApiResponse(ErrorSerializer, description="Conflicts with the current state."),
}


# --------------------------------------------------------------------------- serializers

class VersionSerializer(serializers.ModelSerializer):
    model_name = serializers.CharField(source="model.name", read_only=True)
    project = serializers.IntegerField(source="model.project_id", read_only=True)
    uri = serializers.CharField(read_only=True,
                                help_text="models:/<name>/<version> once ready, else empty.")
    run_name = serializers.CharField(source="run.name", read_only=True)
    aliases = serializers.SerializerMethodField(
        help_text="Its aliases (asked for, while it is pending).")
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    mlflow_url = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        fields = ["id", "model", "model_name", "project", "version", "uri", "state", "error",
                  "run", "run_name", "step", "description", "tags", "aliases", "source",
                  "mlflow_url", "created_by", "created_at", "updated_at"]
        read_only_fields = fields

    def get_aliases(self, obj) -> list[str]:
        return obj.alias_names()

    def get_mlflow_url(self, obj) -> str:
        return services.mlflow_url(obj.model.name, obj.version) if obj.version else ""


class ParentSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    uri = serializers.CharField()
    run = serializers.IntegerField(source="run_id")


class VersionDetailSerializer(VersionSerializer):
    lineage = serializers.JSONField(
        read_only=True, help_text="What the run recorded (rl_core.lineage): data files with "
        "SHA-256 hashes, the spec, the code version, the parent model and the run.")
    parent = serializers.SerializerMethodField(
        help_text="The registered version the run started from, when it did.")

    class Meta(VersionSerializer.Meta):
        fields = VersionSerializer.Meta.fields + ["lineage", "parent"]
        read_only_fields = fields

    @extend_schema_field(ParentSerializer(allow_null=True))
    def get_parent(self, obj):
        parent = services.parent_of(obj)
        return ParentSerializer(parent).data if parent else None


class ModelSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    latest_version = serializers.SerializerMethodField()
    aliases = serializers.SerializerMethodField(help_text="alias -> version number")
    mlflow_url = serializers.SerializerMethodField()

    class Meta:
        model = RegisteredModel
        fields = ["id", "name", "project", "description", "latest_version", "aliases",
                  "mlflow_url", "created_by", "created_at", "updated_at"]
        read_only_fields = fields

    def get_latest_version(self, obj) -> int | None:
        return max((v.version for v in obj.versions.all() if v.version), default=None)

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"}})
    def get_aliases(self, obj):
        return {a.name: a.version.version for a in obj.aliases.all()}

    def get_mlflow_url(self, obj) -> str:
        return services.mlflow_url(obj.name)


class ModelDetailSerializer(ModelSerializer):
    versions = VersionSerializer(many=True, read_only=True)

    class Meta(ModelSerializer.Meta):
        fields = ModelSerializer.Meta.fields + ["versions"]
        read_only_fields = fields


class RegisterSerializer(StrictSerializer):
    run = serializers.IntegerField(help_text="The run whose checkpoint becomes the version.")
    name = serializers.CharField(max_length=128, help_text="The model's name (new or existing "
                                 "in the run's project).")
    step = serializers.IntegerField(required=False, allow_null=True, min_value=0,
                                    help_text="The checkpoint's step; default: the latest.")
    description = serializers.CharField(required=False, allow_blank=True, max_length=5000,
                                        default="")
    tags = serializers.DictField(child=serializers.CharField(allow_blank=True, max_length=5000),
                                 required=False, default=dict)
    aliases = serializers.ListField(child=serializers.CharField(max_length=64), required=False,
                                    default=list, max_length=20)


class VersionChangeSerializer(StrictSerializer):
    description = serializers.CharField(required=False, allow_blank=True, max_length=5000)
    tags = serializers.DictField(child=serializers.CharField(allow_blank=True, max_length=5000),
                                 required=False, help_text="Replaces the version's tags.")
    aliases = serializers.ListField(child=serializers.CharField(max_length=64), required=False,
                                    max_length=20, help_text="Replaces its aliases; an alias "
                                    "another version had moves here.")


class ModelChangeSerializer(StrictSerializer):
    description = serializers.CharField(allow_blank=True, max_length=5000)


# --------------------------------------------------------------------------- views

class ModelFilter(django_filters.FilterSet):
    project = IdFilter(field_name="project_id", help_text="A project id.")

    class Meta:
        model = RegisteredModel
        fields = ["project"]


@extend_schema_view(
    list=extend_schema(summary="List the registered models of your projects.",
                       responses={200: ModelSerializer(many=True), **ERRORS}),
    retrieve=extend_schema(summary="A registered model with its versions.",
                           responses={200: ModelDetailSerializer, **ERRORS}),
    partial_update=extend_schema(summary="Change a model's description (owners, maintainers).",
                                 request=ModelChangeSerializer,
                                 responses={200: ModelDetailSerializer, **ERRORS}),
)
class ModelViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Registered models: a run's checkpoint becomes a version (POST /model-versions/)."""

    permission_classes = [IsAuthenticated]
    filter_backends = [DjangoFilterBackend, SearchFilter]
    filterset_class = ModelFilter
    search_fields = ["name", "description"]
    http_method_names = ["get", "patch", "head", "options"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # the schema's generation
            return RegisteredModel.objects.none()
        return services.visible_models(self.request.user).prefetch_related(
            "versions", "aliases__version").distinct()

    def get_serializer_class(self):
        return ModelSerializer if self.action == "list" else ModelDetailSerializer

    def partial_update(self, request, pk=None):
        model = self.get_object()
        change = ModelChangeSerializer(data=request.data)
        change.is_valid(raise_exception=True)
        services.update_model(model, request.user, change.validated_data["description"])
        return Response(ModelDetailSerializer(self.get_object()).data)


class VersionFilter(django_filters.FilterSet):
    model = IdFilter(field_name="model_id", help_text="A model id.")
    run = IdFilter(field_name="run_id", help_text="A run id: the versions made from it.")
    project = IdFilter(field_name="model__project_id", help_text="A project id.")

    class Meta:
        model = ModelVersion
        fields = ["model", "run", "project", "state"]


@extend_schema_view(
    list=extend_schema(summary="List model versions (filter by model, run, project, state).",
                       responses={200: VersionSerializer(many=True), **ERRORS}),
    retrieve=extend_schema(summary="A model version with its lineage.",
                           responses={200: VersionDetailSerializer, **ERRORS}),
    create=extend_schema(
        summary="Register a run's checkpoint as a new version of a model.",
        description="Answers 202 with the version, `pending` while the worker exports the "
        "checkpoint as a Hugging Face folder and registers it in MLflow; poll it until `ready` "
        "(or `failed`, with `error`). Owners and maintainers of the run's project.",
        request=RegisterSerializer, responses={202: VersionDetailSerializer, **ERRORS}),
    partial_update=extend_schema(
        summary="Change a version's description, tags or aliases (owners, maintainers).",
        request=VersionChangeSerializer, responses={200: VersionDetailSerializer, **ERRORS}),
)
class VersionViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Versions of registered models, each from one run's checkpoint, with its lineage."""

    permission_classes = [IsAuthenticated]
    filter_backends = [DjangoFilterBackend]
    filterset_class = VersionFilter
    http_method_names = ["get", "post", "patch", "head", "options"]

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return ModelVersion.objects.none()
        return services.visible_versions(self.request.user).prefetch_related(
            "aliases").distinct().order_by("-id")

    def get_serializer_class(self):
        return VersionSerializer if self.action == "list" else VersionDetailSerializer

    def create(self, request):
        body = RegisterSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        run = get_object_or_404(visible_runs(request.user).select_related("experiment__project"),
                                pk=data["run"])
        version = services.register(run, request.user, name=data["name"], step=data.get("step"),
                                    description=data["description"], tags=data["tags"],
                                    aliases=data["aliases"])
        return Response(VersionDetailSerializer(version).data, status=status.HTTP_202_ACCEPTED)

    def partial_update(self, request, pk=None):
        version = self.get_object()
        change = VersionChangeSerializer(data=request.data)
        change.is_valid(raise_exception=True)
        services.update_version(version, request.user, **change.validated_data)
        return Response(VersionDetailSerializer(self.get_object()).data)

