"""Query filters for list endpoints (django-filter).

The run filter and the id filter are the domain's (experiments.filters), shared with the web UI:
an id of an object you cannot see and an id that does not exist both give an empty page.
"""

import django_filters

from clusters.models import Node
from experiments.filters import IdFilter, RunFilter
from experiments.models import Experiment

__all__ = ["ExperimentFilter", "IdFilter", "NodeFilter", "RunFilter"]


class ExperimentFilter(django_filters.FilterSet):
    project = IdFilter(field_name="project_id", help_text="A project id.")

    class Meta:
        model = Experiment
        fields = ["project"]


class NodeFilter(django_filters.FilterSet):
    cluster = django_filters.CharFilter(field_name="cluster__name", help_text="A cluster name.")

    class Meta:
        model = Node
        fields = ["cluster", "state", "device_type"]
