"""Every domain model has a working admin page."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from experiments.services import Submission, submit_run

PAGES = ["clusters/cluster", "clusters/node", "accounts/project", "accounts/apitoken",
         "experiments/experiment", "experiments/run"]


@pytest.mark.parametrize("page", PAGES)
def test_the_admin_lists_and_shows_each_model(client, experiment, cluster, users, tiny_spec, page):
    superuser = get_user_model().objects.create_superuser("root", "", "pw")
    client.force_login(superuser)
    submit_run(experiment, users["owner"], Submission(spec=tiny_spec))
    listing = client.get(f"/admin/{page}/")
    assert listing.status_code == 200
    model = listing.context["cl"].queryset.model
    first = model.objects.first()
    if first is not None:
        assert client.get(f"/admin/{page}/{first.pk}/change/").status_code == 200
