"""The run filter (django-filter) of the REST API's run list and the web UI's runs page.

Filters by id take any id in range and match only what the list already shows, so an id of an
object you cannot see and an id that does not exist both give an empty page: neither leaks.
"""

from __future__ import annotations

import django_filters
from django import forms
from drf_spectacular.utils import extend_schema_field

from experiments.choices import RunState
from experiments.models import Run
from experiments.queries import ID_MAX, search_runs, tagged


class IdField(forms.IntegerField):
    """A positive id that fits a database id column, with an error naming the limit."""

    def __init__(self, **kwargs):
        kwargs.setdefault("min_value", 1)
        kwargs.setdefault("max_value", ID_MAX)
        kwargs.setdefault("error_messages", {
            "invalid": "Must be an id: a whole number such as 12.",
            "min_value": "Must be an id of at least 1.",
            "max_value": f"Must be an id of at most {ID_MAX} (a 64-bit integer).",
        })
        super().__init__(**kwargs)


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": ID_MAX})
class IdFilter(django_filters.NumberFilter):
    """Match objects by an id column; unknown and invisible ids match nothing alike."""

    field_class = IdField

    def get_max_validator(self):
        return None  # IdField holds the limit, with a message that says it


class RunFilter(django_filters.FilterSet):
    state = django_filters.MultipleChoiceFilter(
        choices=RunState.choices, help_text="Repeat to match any of several states."
    )
    experiment = IdFilter(field_name="experiment_id", help_text="An experiment id.")
    project = IdFilter(field_name="experiment__project_id", help_text="A project id.")
    creator = django_filters.CharFilter(field_name="created_by__username", help_text="A username.")
    created_after = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="gte")
    created_before = django_filters.IsoDateTimeFilter(field_name="created_at", lookup_expr="lt")
    search = django_filters.CharFilter(
        method="filter_search",
        help_text="Words that must each appear in the run's or its experiment's name or in one "
                  "of its tags; a word such as 12 or #12 also matches run 12.",
    )
    tag = django_filters.CharFilter(
        method="filter_tags", help_text="A tag (any case); repeat to match runs that have each.")

    class Meta:
        model = Run
        fields = ["state", "experiment", "project", "creator", "algorithm", "device_type"]

    def filter_search(self, queryset, name, value):
        return search_runs(queryset, value)

    def filter_tags(self, queryset, name, value):
        tags = self.data.getlist(name) if hasattr(self.data, "getlist") else [value]
        for tag in filter(str.strip, tags):
            queryset = queryset.filter(tagged(tag))
        return queryset
