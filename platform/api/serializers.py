"""Serializers of the REST API. Input is validated here, once; domain actions live in services."""

from __future__ import annotations

import operator

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import ISO_8601, serializers
from rest_framework.settings import api_settings

from accounts.choices import Role
from accounts.models import Invitation, Membership, Project
from accounts.queries import visible_projects
from accounts.validation import InviteInput, RoleInput, TokenInput
from api.parsers import StrictJSONDecoder
from api.strict import JSONObjectField, StrictInputMixin, StrictModelSerializer, StrictSerializer
from ascent.validators import plain_text
from clusters.models import ROOT_FIELDS, Cluster, Node, normalize_roots
from clusters.services import cluster_capacity
from experiments.choices import TERMINAL_STATES, WaitingCause
from experiments.limits import MAX_RESTARTS, PRIORITY
from experiments.models import Attempt, Experiment, Run, RunEvent
from experiments.validation import AllocationInput, QuotasInput, RunNotesInput
from notifications.models import Delivery, Webhook
from notifications.validation import EmailSubscriptionInput, WebhookInput
from rl_core.spec import SpecError, check_spec_bounds, override_refusal

User = get_user_model()


# --- clusters -------------------------------------------------------------------------------

class NodeSerializer(StrictModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", queryset=Cluster.objects.all())
    device_kind = serializers.CharField(read_only=True)

    class Meta:
        model = Node
        fields = ["id", "cluster", "hostname", "address", "device_type", "device_kind",
                  "device_count", "healthy_device_count", "memory_bytes", "cpu_count", "labels",
                  "state", "last_seen", "created_at"]
        read_only_fields = ["created_at"]

    def validate(self, attrs):
        count = attrs.get("device_count", getattr(self.instance, "device_count", 0))
        healthy = attrs.get("healthy_device_count", getattr(self.instance, "healthy_device_count", 0))
        if healthy > count:
            raise serializers.ValidationError(
                {"healthy_device_count": f"{healthy} healthy devices exceed device_count ({count})."}
            )
        return attrs


class CapacitySerializer(serializers.Serializer):
    total = serializers.IntegerField(help_text="Devices on nodes that are not down.")
    healthy = serializers.IntegerField(help_text="Healthy devices on ready nodes.")
    held = serializers.IntegerField(help_text="Devices held by active attempts.")
    free = serializers.IntegerField(help_text="healthy - held, never below zero.")


class ClusterSerializer(StrictModelSerializer):
    capacity = serializers.SerializerMethodField(help_text="Per device kind (npu, gpu, cpu).")
    node_count = serializers.SerializerMethodField()

    class Meta:
        model = Cluster
        fields = ["id", "name", "device_type", "ray_address", "status", "labels", "last_probe_at",
                  "last_probe_error", "created_at", "node_count", "capacity", *ROOT_FIELDS,
                  "allow_trust_remote_code"]
        read_only_fields = ["status", "last_probe_at", "last_probe_error", "created_at"]

    def validate(self, attrs):
        """Allowed roots are stored normalized (`/models/./a/` -> `/models/a`)."""
        for name in ROOT_FIELDS:
            if isinstance(attrs.get(name), list):
                attrs[name] = normalize_roots(attrs[name])
        return attrs

    @extend_schema_field(serializers.DictField(child=CapacitySerializer()))
    def get_capacity(self, obj) -> dict:
        return {kind: cap.as_dict() for kind, cap in cluster_capacity(obj).items()}

    def get_node_count(self, obj) -> int:
        return obj.nodes.count()


# --- accounts -------------------------------------------------------------------------------

class MembershipSerializer(StrictModelSerializer):
    username = serializers.SlugRelatedField(
        source="user", slug_field="username", queryset=User.objects.all(),
        error_messages={"does_not_exist": "There is no user named {value}."},
    )

    class Meta:
        model = Membership
        fields = ["username", "role", "created_at"]
        read_only_fields = ["created_at"]


class MembershipRoleSerializer(StrictInputMixin, RoleInput):
    """A member's new role."""


class InviteSerializer(StrictInputMixin, InviteInput):
    """Who to invite, with which role; the same answer whether or not the user exists."""


class InvitationSerializer(serializers.ModelSerializer):
    project_name = serializers.CharField(source="project.name", read_only=True)
    invited_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Invitation
        fields = ["id", "project", "project_name", "username", "role", "invited_by", "state",
                  "created_at", "answered_at"]
        read_only_fields = fields


class ProjectSerializer(StrictModelSerializer):
    my_role = serializers.SerializerMethodField()

    class Meta:
        model = Project
        fields = ["id", "name", "description", "created_at", "my_role"]
        read_only_fields = ["created_at"]
        extra_kwargs = {"name": {"help_text": "Unique among all projects (a taken name is a 400 "
                                              "naming `name`)."}}

    @extend_schema_field(serializers.ChoiceField(choices=Role.choices, allow_null=True))
    def get_my_role(self, obj):
        request = self.context.get("request")
        role = obj.role_of(request.user) if request else None
        return role.value if role else None


class QuotasSerializer(StrictInputMixin, QuotasInput):
    __doc__ = QuotasInput.__doc__


class AllocationInputSerializer(StrictInputMixin, AllocationInput):
    """New weight and quotas (staff). PUT: `quotas` replaces every quota (kinds left out lose
    theirs); PATCH: only the kinds named change. A key left out keeps what the project has."""

    quotas = QuotasSerializer(required=False)


class AllocationSerializer(serializers.Serializer):
    """A project's share of the devices: what limits it and what it holds now."""

    share_weight = serializers.FloatField()
    quotas = serializers.DictField(child=serializers.IntegerField(),
                                   help_text="Device kind -> quota; a kind absent has no limit.")
    held = serializers.DictField(child=serializers.IntegerField(),
                                 help_text="Device kind -> devices its active runs hold now.")
    healthy = serializers.DictField(child=serializers.IntegerField(),
                                    help_text="Device kind -> healthy devices on all clusters.")
    dominant_share = serializers.FloatField(
        help_text="max over kinds of held / healthy, divided by the weight: among waiting runs, "
                  "the project with the least goes first.")
    waiting = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Cause (capacity, quota, share, limit, cluster) -> its queued runs waiting "
                  "for it.")


class WebhookSerializer(serializers.ModelSerializer):
    """A project's webhook; its secret is shown only in the answer that created it."""

    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    last_delivery = serializers.SerializerMethodField(
        help_text="The newest delivery's state and time, or null.")

    class Meta:
        model = Webhook
        fields = ["id", "name", "url", "format", "events", "stall_minutes", "active",
                  "allow_local", "created_by", "created_at", "last_delivery"]
        read_only_fields = fields

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_last_delivery(self, obj):
        last = obj.deliveries.order_by("-created_at", "-id").first()
        return None if last is None else {"id": last.pk, "event": last.event, "state": last.state,
                                          "created_at": last.created_at}


class NewWebhookSerializer(WebhookSerializer):
    secret = serializers.CharField(read_only=True, help_text="Signs every request (HMAC-SHA256); "
                                   "shown only in this answer.")

    class Meta(WebhookSerializer.Meta):
        fields = WebhookSerializer.Meta.fields + ["secret"]
        read_only_fields = fields


class WebhookInputSerializer(StrictInputMixin, WebhookInput):
    """A new webhook (POST: name, url and events required) or changes to one (PATCH)."""


class DeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = Delivery
        fields = ["id", "event", "run", "state", "attempts", "next_attempt_at", "last_status",
                  "last_error", "created_at", "delivered_at", "payload"]
        read_only_fields = fields


class EmailSubscriptionSerializer(StrictInputMixin, EmailSubscriptionInput):
    project = serializers.IntegerField(help_text="A project you are a member of.")


class TokenSerializer(StrictInputMixin, TokenInput):
    """One of your API tokens; only its hash is kept (the token itself is returned once)."""

    is_active = serializers.BooleanField(read_only=True)

    class Meta(TokenInput.Meta):
        fields = ["id", "name", "prefix", "created_at", "expires_at", "revoked_at", "last_used_at",
                  "is_active", "expires_in_days"]
        read_only_fields = ["prefix", "created_at", "expires_at", "revoked_at", "last_used_at"]


class NewTokenSerializer(TokenSerializer):
    token = serializers.SerializerMethodField(help_text="The token itself. It is shown only once.")

    class Meta(TokenSerializer.Meta):
        fields = TokenSerializer.Meta.fields + ["token"]

    def get_token(self, obj) -> str:
        return obj.raw


# --- experiments and runs -------------------------------------------------------------------

class UserProjectField(serializers.PrimaryKeyRelatedField):
    """A project the requesting user can see; others read as nonexistent."""

    def get_queryset(self):
        return visible_projects(self.context["request"].user)


class ExperimentSerializer(StrictModelSerializer):
    project = UserProjectField()
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    run_count = serializers.SerializerMethodField(help_text="Runs in the experiment.")

    class Meta:
        model = Experiment
        fields = ["id", "project", "name", "description", "mlflow_experiment_id", "created_by",
                  "created_at", "run_count"]
        read_only_fields = ["mlflow_experiment_id", "created_at"]
        extra_kwargs = {"name": {"help_text": "Unique within its project (a taken name is a 400)."}}
        validators = [
            serializers.UniqueTogetherValidator(
                queryset=Experiment.objects.all(), fields=["project", "name"],
                message="This project already has an experiment with this name.",
            )
        ]

    def get_run_count(self, obj) -> int:
        annotated = getattr(obj, "run_count", None)  # the list's queryset counts in one query
        return obj.runs.count() if annotated is None else annotated

    def validate_project(self, project):
        if self.instance is not None and project != self.instance.project:
            raise serializers.ValidationError("An experiment cannot move to another project.")
        return project


class AttemptSerializer(serializers.ModelSerializer):
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Attempt
        fields = ["number", "ray_submission_id", "cluster", "device_count", "started_at",
                  "launched_at", "last_seen_at", "ended_at", "exit_code", "exit_message", "preempted"]


class RunEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = RunEvent
        fields = ["id", "from_state", "to_state", "created_at", "actor", "message"]


class RunModelVersionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    model = serializers.IntegerField(source="model_id")
    name = serializers.CharField(source="model.name")
    version = serializers.IntegerField(allow_null=True)
    step = serializers.IntegerField()
    state = serializers.CharField()


class RunSerializer(serializers.ModelSerializer):
    project = serializers.IntegerField(source="experiment.project_id", read_only=True)
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    attempts = AttemptSerializer(many=True, read_only=True)
    is_terminal = serializers.BooleanField(read_only=True)
    tags = serializers.ListField(source="tag_names", child=serializers.CharField(), read_only=True,
                                 help_text="The run's tags, sorted (PATCH the run to change them).")
    waiting_cause = serializers.ChoiceField(
        choices=[("", "not waiting"), *WaitingCause.choices], read_only=True,
        help_text="Why a queued run waits, in one word (quota, share, capacity, limit, "
                  "cluster); empty when it does not wait. `waiting_reason` says it in full.")

    model_versions = serializers.SerializerMethodField(
        help_text="The model versions registered from this run's checkpoints.")

    class Meta:
        model = Run
        fields = ["id", "name", "project", "experiment", "algorithm", "state", "is_terminal",
                  "priority", "device_type", "device_count", "cluster", "max_restarts",
                  "preemptible",
                  "created_by", "cloned_from", "resume_from", "created_at", "updated_at", "started_at",
                  "finished_at", "progress_step", "progress_at", "planned_steps", "mlflow_run_id",
                  "error", "waiting_reason", "waiting_cause", "tags", "note", "attempts", "spec",
                  "model_versions"]
        read_only_fields = fields

    @extend_schema_field(RunModelVersionSerializer(many=True))
    def get_model_versions(self, obj):
        return RunModelVersionSerializer(
            obj.model_versions.select_related("model").order_by("id"), many=True).data


class RunNotesSerializer(StrictInputMixin, RunNotesInput):
    """A run's new tags and/or note (PATCH); keys left out keep what the run has."""


# What a page of runs leaves out: the large fields (see each run for them).
LEFT_OUT_OF_LISTS = ("spec", "attempts", "note", "model_versions")


class FromRows:
    """A read-only serializer's output made from rows of `QuerySet.values(*cls.columns())`, not
    from model instances: building runs and their related rows, and DRF's general field lookup,
    were most of the time a page of runs took. `computed` names the fields that are not a
    column: name -> (the column they need or None, a getter over the row). The output is the
    same as ModelSerializer's (tests/platform/test_runs_list_queries.py compares them)."""

    computed: dict = {}

    @classmethod
    def columns(cls) -> list[str]:
        """What the query selects: the columns shown, related ones by their lookups
        (`created_by__username`), a foreign key by its name (its id)."""
        if "_columns" not in cls.__dict__:  # once per class: building the fields takes a while
            keys = (_row_key(cls, field) for field in _fields_of(cls))
            cls._columns = list(dict.fromkeys(key for key in keys if key is not None))
        return cls._columns

    def to_representation(self, row):
        """The row's fields, read with a getter per field made once per serializer (page)."""
        readers = self.__dict__.get("_readers")
        if readers is None:
            readers = self._readers = _row_readers(type(self))
        return {name: read(row) for name, read in readers}


RUN_COMPUTED = {
    "is_terminal": ("state", lambda row: row["state"] in TERMINAL_STATES),
    "tags": (None, operator.itemgetter("tags")),  # experiments.queries.with_tag_names
}


class RunListSerializer(FromRows, RunSerializer):
    """The list view leaves out the spec, the attempts and the note to keep pages small. It
    serializes rows, each with its `tags` added (`experiments.queries.with_tag_names`)."""

    computed = RUN_COMPUTED

    class Meta(RunSerializer.Meta):
        fields = [f for f in RunSerializer.Meta.fields if f not in LEFT_OUT_OF_LISTS]
        read_only_fields = fields


class AttemptRowSerializer(FromRows, AttemptSerializer):
    """AttemptSerializer's output from rows."""


class RunRowSerializer(FromRows, RunSerializer):
    """RunSerializer's output (a run: GET runs/{id}/) from a row with its `tags`, its
    `attempts` (AttemptRowSerializer's output) and its `model_versions`
    (RunModelVersionSerializer's) added."""

    computed = {**RUN_COMPUTED, "attempts": (None, operator.itemgetter("attempts")),
                "model_versions": (None, operator.itemgetter("model_versions"))}


# Fields whose value, as the database gives it, is already what ModelSerializer outputs.
_AS_STORED = (serializers.CharField, serializers.IntegerField, serializers.BooleanField,
              serializers.ChoiceField, serializers.PrimaryKeyRelatedField,
              serializers.SlugRelatedField, serializers.JSONField)


def _fields_of(serializer_class) -> list:
    """The readable fields of a FromRows serializer, built once per class."""
    if "_row_fields" not in serializer_class.__dict__:
        serializer_class._row_fields = list(serializer_class()._readable_fields)
    return serializer_class._row_fields


def _row_key(serializer_class, field) -> str | None:
    """The `values()` name a field is read from."""
    if field.field_name in serializer_class.computed:
        return serializer_class.computed[field.field_name][0]
    if isinstance(field, serializers.SlugRelatedField):
        return f"{field.source}__{field.slug_field}"
    return "__".join(field.source_attrs)  # a foreign key's name alone gives its id


def _row_readers(serializer_class) -> list:
    """(name, getter) of each field of a FromRows serializer over a row. Only date-times need
    converting: the database gives the other columns as ModelSerializer outputs them."""
    zone = timezone.get_current_timezone() if settings.USE_TZ else None
    readers = []
    for field in _fields_of(serializer_class):
        key = _row_key(serializer_class, field)
        if field.field_name in serializer_class.computed:
            read = serializer_class.computed[field.field_name][1]
        elif isinstance(field, serializers.DateTimeField):
            read = _datetime_reader(field, key, zone)
        elif isinstance(field, _AS_STORED):
            read = operator.itemgetter(key)
        else:
            read = _generic_reader(field, key)
        readers.append((field.field_name, read))
    return readers


def _generic_reader(field, key: str):
    return lambda row: None if (value := row[key]) is None else field.to_representation(value)


def _datetime_reader(field, key: str, zone):
    """DateTimeField.to_representation of an aware date-time column, in `zone`, without its
    per-value lookup of the current time zone."""
    if zone is None or getattr(field, "format", api_settings.DATETIME_FORMAT) != ISO_8601:
        return _generic_reader(field, key)

    def read(row):
        value = row[key]
        if value is None:
            return None
        text = value.astimezone(zone).isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    return read


def _refuse_big_overrides(overrides: list[str]) -> list[str]:
    """Overrides whose values are plain YAML within the spec's limits; else a 400 at overrides.N."""
    errors = {str(i): [why] for i, item in enumerate(overrides) if (why := override_refusal(item))}
    if errors:
        raise serializers.ValidationError(errors)
    return overrides


class SubmissionFields(StrictSerializer):
    """Fields shared by submit and validate."""

    spec = JSONObjectField(
        decoder=StrictJSONDecoder,
        help_text="A RunSpec as an object (see /api/v1/spec/schema/); unset fields take the "
        "algorithm's preset; at most 64 KiB as JSON and 16 levels deep.",
    )
    overrides = serializers.ListField(
        child=serializers.CharField(max_length=500), required=False, default=list, max_length=200,
        help_text='Dotted overrides applied to the spec, e.g. ["rollout.n_samples_per_prompt=8"].',
    )
    cluster = serializers.SlugRelatedField(
        slug_field="name", queryset=Cluster.objects.all(), required=False, allow_null=True,
        help_text="Run only on this cluster (by name); omit for any cluster that fits.",
    )

    @extend_schema_field(OpenApiTypes.OBJECT)
    def validate_spec(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("Must be a JSON object (a RunSpec).")
        try:
            check_spec_bounds(value)
        except SpecError as exc:
            [error] = exc.errors
            field, message = error["field"], error["message"]
            raise serializers.ValidationError({field: [message]} if field else [message]) from None
        return value

    def validate_overrides(self, value):
        return _refuse_big_overrides(value)


class RunSubmitSerializer(SubmissionFields):
    experiment = serializers.PrimaryKeyRelatedField(queryset=Experiment.objects.none())
    name = serializers.CharField(max_length=128, required=False, allow_blank=True, default="",
                                 validators=[plain_text])
    priority = serializers.IntegerField(
        min_value=PRIORITY.low, max_value=PRIORITY.high, default=PRIORITY.default,
        error_messages=PRIORITY.error_messages(), help_text="Higher runs first.")
    max_restarts = serializers.IntegerField(
        min_value=MAX_RESTARTS.low, max_value=MAX_RESTARTS.high, default=MAX_RESTARTS.default,
        error_messages=MAX_RESTARTS.error_messages(),
        help_text="Automatic retries of a run that fails for a reason other than its spec.")
    preemptible = serializers.BooleanField(
        default=True, help_text="May be stopped for a run of higher priority while its project "
        "holds more than its share: it saves the step in progress, goes back to the queue and "
        "resumes from that checkpoint. false: never preempted.")
    ignore_memory_plan = serializers.BooleanField(
        default=False, help_text="Submit even when the memory plan (see runs/validate) says the "
        "run does not fit the devices it could get; otherwise such a run is refused with a 400.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        request = self.context.get("request")
        if request is not None:
            self.fields["experiment"].queryset = Experiment.objects.filter(
                project__in=visible_projects(request.user)
            )


class RunValidateSerializer(SubmissionFields):
    pass


class DeviceRequestSerializer(serializers.Serializer):
    device_type = serializers.CharField()
    device_count = serializers.IntegerField()
    num_nodes = serializers.IntegerField()
    devices_per_node = serializers.IntegerField()


class FittingClusterSerializer(serializers.Serializer):
    name = serializers.CharField()
    free = serializers.IntegerField()
    fits_now = serializers.BooleanField()


class PlanComponentSerializer(serializers.Serializer):
    name = serializers.CharField()
    bytes = serializers.IntegerField(help_text="Bytes per device.")
    phases = serializers.ListField(child=serializers.CharField(),
                                   help_text="The phases it is on the device in.")
    note = serializers.CharField(allow_blank=True)
    host = serializers.BooleanField(help_text="It lives in host memory outside those phases.")
    role = serializers.CharField(help_text="actor, reference, critic, reward_model, or rollout "
                                 "(a rollout pool of its own).")
    device = serializers.CharField(help_text="The devices that hold it: training, or pool (a "
                                   "rollout pool of its own, parallel.rollout_devices).")


class PlanAlternativeSerializer(serializers.Serializer):
    change = serializers.CharField(help_text="Dotted overrides, this one's and those before it.")
    adds = serializers.CharField(help_text="The overrides it adds to the one before.")
    peak_bytes = serializers.IntegerField()
    peak_phase = serializers.CharField()
    fits = serializers.BooleanField(allow_null=True)


class PhaseBytesField(serializers.DictField):
    child = serializers.IntegerField()


class MemoryPlanSerializer(serializers.Serializer):
    model = serializers.CharField(allow_blank=True)
    parameters = serializers.IntegerField()
    strategy = serializers.CharField()
    devices = serializers.IntegerField(help_text="Data-parallel devices fsdp2 shards over.")
    dtype = serializers.CharField()
    setup = serializers.DictField(help_text="What the plan read from the spec.")
    components = PlanComponentSerializer(many=True)
    phases = PhaseBytesField(help_text="Device bytes per phase: load, rollout, log-probs, "
                             "backward, step.")
    peak_phase = serializers.CharField()
    peak_device = serializers.CharField(help_text="training, or pool: the kind of device whose "
                                        "peak is the plan's (phases and total_bytes are one "
                                        "device of that kind's).")
    device_peaks = serializers.DictField(child=serializers.IntegerField(),
                                         help_text="The peak bytes of one device of each kind.")
    roles = serializers.DictField(child=PhaseBytesField(), help_text="Per role, bytes per phase.")
    total_bytes = serializers.IntegerField(help_text="The peak: bytes of the largest phase.")
    host_bytes = serializers.IntegerField()
    device_memory_bytes = serializers.IntegerField(allow_null=True)
    usable_bytes = serializers.IntegerField(allow_null=True, help_text="Device memory less "
                                            "the headroom kept free.")
    fits = serializers.BooleanField(allow_null=True, help_text="null: device memory unknown.")
    message = serializers.CharField(help_text="The verdict; when it does not fit, what to change.")
    alternatives = PlanAlternativeSerializer(many=True)
    device_model = serializers.CharField(allow_null=True, help_text="The device model compared "
                                         "with, e.g. ascend-910b.")
    device_cluster = serializers.CharField(allow_null=True, help_text="The cluster it is on; "
                                           "null: a default for the device kind.")


class ValidationResultSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    spec = serializers.JSONField(help_text="The resolved spec: preset, your values, overrides.")
    device_request = DeviceRequestSerializer()
    clusters = FittingClusterSerializer(many=True, help_text="Clusters offering this device kind.")
    memory_plan = MemoryPlanSerializer(
        allow_null=True, help_text="Memory per device on the largest healthy device of the "
        "spec's kind on the chosen cluster (any cluster when none is named); null when the "
        "model's shape cannot be known here (see memory_plan_reason).")
    memory_plan_reason = serializers.CharField(
        allow_blank=True, help_text="Why memory_plan is null; empty otherwise.")


class CloneSerializer(StrictSerializer):
    name = serializers.CharField(max_length=128, required=False, allow_blank=True, default="",
                                 validators=[plain_text])
    priority = serializers.IntegerField(min_value=PRIORITY.low, max_value=PRIORITY.high,
                                        required=False, error_messages=PRIORITY.error_messages())
    overrides = serializers.ListField(
        child=serializers.CharField(max_length=500), required=False, default=list, max_length=200
    )
    ignore_memory_plan = serializers.BooleanField(
        default=False, help_text="Clone even when the memory plan says it does not fit.")

    def validate_overrides(self, value):
        return _refuse_big_overrides(value)


class MeProjectSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    role = serializers.ChoiceField(choices=Role.choices)


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    email = serializers.EmailField(allow_blank=True, help_text="Where your notification "
                                   "e-mails go (me/notifications/); empty: none can be sent.")
    is_staff = serializers.BooleanField()
    projects = MeProjectSerializer(many=True, help_text="Your memberships.")
    server_time = serializers.DateTimeField()


class MeInputSerializer(StrictSerializer):
    email = serializers.EmailField(allow_blank=True, max_length=254, required=False,
                                   help_text="Your e-mail address for notifications; left "
                                   "out: unchanged.")


class ErrorItemSerializer(serializers.Serializer):
    field = serializers.CharField()
    message = serializers.CharField()


class ErrorSerializer(serializers.Serializer):
    error = serializers.CharField()
    detail = serializers.CharField()
    errors = ErrorItemSerializer(many=True, required=False)


# --- run data: logs, metrics, artifacts; cluster utilisation ---------------------------------

class LogPageSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(allow_null=True, help_text="Attempt number (null: none yet).")
    offset = serializers.IntegerField(help_text="Pass as `offset` to read what comes next.")
    text = serializers.CharField(allow_blank=True)
    complete = serializers.BooleanField(help_text="The attempt has ended: no more text will come.")


class MetricPointSerializer(serializers.ListField):
    child = serializers.FloatField()


class MetricsSerializer(serializers.Serializer):
    mlflow_run_id = serializers.CharField(allow_blank=True)
    mlflow_url = serializers.CharField(allow_blank=True)
    keys = serializers.ListField(child=serializers.CharField())
    latest = serializers.DictField(child=serializers.FloatField())
    history = serializers.DictField(
        child=serializers.ListField(child=MetricPointSerializer()),
        help_text="Per requested key: [step, value, timestamp ms] points, down-sampled.")


class ArtifactSerializer(serializers.Serializer):
    path = serializers.CharField()
    is_dir = serializers.BooleanField()
    size = serializers.IntegerField(allow_null=True)
    step = serializers.IntegerField(allow_null=True, help_text="For checkpoints/step_N folders.")
    url = serializers.CharField(help_text="The run's page in MLflow.")


class KindUtilisationSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    healthy = serializers.IntegerField()
    held = serializers.IntegerField()
    free = serializers.IntegerField()
    utilisation = serializers.FloatField(help_text="held / healthy (0 when nothing is healthy).")


class ActiveRunSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField(allow_blank=True)
    state = serializers.CharField()
    device_type = serializers.CharField()
    device_count = serializers.IntegerField()


class OtherRunsSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Active runs of projects you are not a member of.")
    device_count = serializers.IntegerField(help_text="Devices those runs request.")


class UtilisationSerializer(serializers.Serializer):
    cluster = serializers.CharField()
    status = serializers.CharField()
    last_probe_at = serializers.DateTimeField(allow_null=True)
    last_probe_error = serializers.CharField(allow_blank=True)
    kinds = serializers.DictField(child=KindUtilisationSerializer())
    runs = ActiveRunSerializer(many=True, help_text="Active runs of projects you can see.")
    other_runs = OtherRunsSerializer(help_text="Active runs of other projects, only counted.")
