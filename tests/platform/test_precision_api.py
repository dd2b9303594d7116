"""The precision comparison through the API: bad input names its parameter; a run without dumps
is a 409 saying how to make them. (A comparison of real dumps: tests/browser/test_tools.py.)"""

from __future__ import annotations

import pytest

from experiments.models import Run
from experiments.precision import Thresholds

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_runs(experiment, users) -> list[Run]:
    spec = {"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}}}
    return [Run.objects.create(experiment=experiment, spec=spec, algorithm="grpo",
                               device_type="cpu", device_count=1, created_by=users["owner"],
                               name=f"run {n}") for n in (1, 2)]


@pytest.mark.parametrize("query, field, message", [
    ("", "against", "Give the reference run's id"),
    ("?against=x", "against", "Give the reference run's id"),
    ("?against=999999", "against", "Run 999999 does not exist"),
    ("?against={a}&cosine_min=2", "cosine_min", "must be in [0, 1]"),
    ("?against={a}&rel_max=nan", "rel_max", "must be in [0, 1e+30]"),
    ("?against={a}&abs_max=big", "abs_max", "'big' is not a number"),
])
def test_bad_input_names_the_parameter(clients, two_runs, query, field, message):
    a, b = two_runs
    response = clients["viewer"].get(f"/api/v1/runs/{b.pk}/precision/{query.format(a=a.pk)}")
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert [e["field"] for e in errors] == [field] and message in errors[0]["message"]


def test_a_run_without_dumps_is_a_conflict_saying_how_to_make_them(clients, two_runs):
    a, b = two_runs
    response = clients["viewer"].get(f"/api/v1/runs/{b.pk}/precision/?against={a.pk}")
    assert response.status_code == 409
    assert f"run {a.pk} has no MLflow run yet" in response.json()["detail"]


def test_thresholds_default_where_absent_and_each_bad_one_is_named():
    assert Thresholds.from_params({}) == (Thresholds(), {})
    chosen, errors = Thresholds.from_params({"cosine_min": "0.99", "abs_max": "-1"})
    assert chosen == Thresholds(cosine_min=0.99) and errors == {"abs_max": "must be in [0, 1e+30]"}
