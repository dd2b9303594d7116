"""Query filters for list endpoints (django-filter)."""

import django_filters

from clusters.models import Node
from experiments.choices import RunState
from experiments.models import Run


class RunFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(
        choices=RunState.choices, help_text="Repeat to match any of several states."
    )
    creator = django_filters.CharFilter(field_name="created_by__username", help_text="A username.")
    project = django_filters.NumberFilter(field_name="experiment__project_id")
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")

    class Meta:
        model = Run
        fields = ["state", "experiment", "project", "creator", "algorithm", "device_type"]


class NodeFilter(django_filters.FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name", help_text="A cluster name.")

    class Meta:
        model = Node
        fields = ["cluster", "state", "device_type"]
