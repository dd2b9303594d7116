"""The settings page's forms that create things: a project and an experiment. Their rules are
the models' (a project's name is a unique slug, lengths), as the REST API's serializers apply
them; who may create is decided by the domain services that save them."""

from __future__ import annotations

from django import forms

from accounts.models import Project
from experiments.models import Experiment


class ProjectForm(forms.ModelForm):
    class Meta:
        model = Project
        fields = ["name", "description"]
        widgets = {"description": forms.TextInput}
        error_messages = {"name": {"unique": "A project with this name exists already: choose "
                                             "another name."}}


class ExperimentForm(forms.ModelForm):
    class Meta:
        model = Experiment
        fields = ["name", "description"]
        widgets = {"description": forms.TextInput}
