"""Run specs beyond the limits through the API and the web UI: a 400 naming the field, nothing
stored, answered fast and small."""

from __future__ import annotations

import json
import time

import pytest

from experiments.models import Run

# A YAML "billion laughs": nine anchors of nine aliases each expand to 9**6 strings.
LAUGHS = (
    "{a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol], b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], "
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b], d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c], "
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d], f: [*e,*e,*e,*e,*e,*e,*e,*e,*e]}"
)
LAUGHS_OVERRIDE = f"reward.functions.0.kwargs={LAUGHS}"


def errors_of(response) -> dict[str, str]:
    return {e["field"]: e["message"] for e in response.json()["errors"]}


def post_json(client, url: str, body: dict):
    return client.post(url, json.dumps(body), content_type="application/json")


@pytest.fixture
def queued_run(submit) -> Run:
    response = submit()
    assert response.status_code == 201, response.json()
    return Run.objects.get(pk=response.json()["id"])


def test_it_answers_a_billion_laughs_on_validate_with_a_small_fast_400(clients, tiny_spec):
    body = {"spec": tiny_spec, "overrides": [LAUGHS_OVERRIDE]}
    assert len(json.dumps(body)) < 500
    started = time.monotonic()
    response = post_json(clients["maintainer"], "/api/v1/runs/validate/", body)
    elapsed = time.monotonic() - started
    assert response.status_code == 400, response.content[:300]
    assert elapsed < 2 and len(response.content) < 2_000
    assert response.json()["error"] == "invalid"
    assert "anchors (&a) are not accepted" in errors_of(response)["overrides.0"]


def test_it_refuses_a_billion_laughs_on_submit_and_stores_nothing(submit):
    response = submit(overrides=["seed=1", LAUGHS_OVERRIDE])
    assert response.status_code == 400
    assert "line 1, column 5" in errors_of(response)["overrides.1"]
    assert Run.objects.count() == 0


def test_it_refuses_a_billion_laughs_on_clone_and_stores_nothing(clients, queued_run):
    response = clients["maintainer"].post(f"/api/v1/runs/{queued_run.pk}/clone/",
                                          {"overrides": [LAUGHS_OVERRIDE]}, format="json")
    assert response.status_code == 400
    assert "write the value out in full" in errors_of(response)["overrides.0"]
    assert Run.objects.count() == 1


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", ".NaN"])
def test_it_refuses_infinite_and_nan_overrides_naming_the_field(submit, value):
    response = submit(overrides=[f"actor.lr={value}"])
    assert response.status_code == 400
    assert "finite number" in errors_of(response)["spec.actor.lr"]
    assert Run.objects.count() == 0


def test_it_refuses_an_infinite_override_on_clone(clients, queued_run):
    response = clients["owner"].post(f"/api/v1/runs/{queued_run.pk}/clone/",
                                     {"overrides": ["rollout.temperature=.inf"]}, format="json")
    assert response.status_code == 400
    assert "finite number" in errors_of(response)["spec.rollout.temperature"]
    assert Run.objects.count() == 1


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_it_refuses_a_json_body_with_a_non_finite_number_naming_the_field(clients, experiment,
                                                                          number):
    body = ('{"experiment": %d, "spec": {"data": {"synthetic": {"task": "addition"}}, '
            '"actor": {"lr": %s}}}' % (experiment.pk, number))
    response = clients["owner"].post("/api/v1/runs/", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"] == "invalid"
    assert f"{number} is not a finite number" in errors_of(response)["spec.actor.lr"]
    assert Run.objects.count() == 0


def test_it_refuses_an_overflowing_number_in_a_spec_sent_as_form_data(clients, experiment):
    response = clients["owner"].post("/api/v1/runs/", {
        "experiment": experiment.pk,
        "spec": '{"data": {"synthetic": {"task": "addition"}}, "actor": {"lr": 1e999}}'})
    assert response.status_code == 400
    assert errors_of(response) == {"spec": "Value must be valid JSON."}
    assert Run.objects.count() == 0


def nested(levels: int) -> list:
    value: list = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_it_refuses_a_body_nested_500_levels(clients, experiment, tiny_spec):
    functions = [{"name": "format", "kwargs": {"a": nested(500)}}]
    spec = {**tiny_spec, "reward": {"functions": functions}}
    response = post_json(clients["owner"], "/api/v1/runs/", {"experiment": experiment.pk,
                                                              "spec": spec})
    assert response.status_code == 400
    [(field, message)] = errors_of(response).items()
    assert field.startswith("spec.reward.functions.0.kwargs.a.0.0") and "limit of 32" in message
    assert Run.objects.count() == 0


def test_it_refuses_a_spec_deeper_than_the_spec_limit_naming_the_path(clients, tiny_spec):
    spec = {**tiny_spec, "reward": {"functions": [{"name": "format", "kwargs": {"a": nested(20)}}]}}
    response = post_json(clients["owner"], "/api/v1/runs/validate/", {"spec": spec})
    assert response.status_code == 400
    [(field, message)] = errors_of(response).items()
    assert field.startswith("spec.reward.functions.0.kwargs.a.0")
    assert "limit of 16 levels" in message


def test_it_refuses_a_spec_larger_than_64_kib(clients, tiny_spec):
    files = [f"/data/{'x' * 200}/{i}.jsonl" for i in range(400)]
    spec = {**tiny_spec, "data": {"train_files": files}}
    response = post_json(clients["owner"], "/api/v1/runs/validate/", {"spec": spec})
    assert response.status_code == 400
    assert "more than the limit of 65536" in errors_of(response)["spec"]


def test_it_refuses_num_nodes_beyond_64_bits(submit, tiny_spec):
    response = submit(overrides=[f"resources.num_nodes={2**70}"])
    assert response.status_code == 400
    assert "less than or equal to 4096" in errors_of(response)["spec.resources.num_nodes"]
    response = submit(spec={**tiny_spec, "resources": {"num_nodes": 2**70}})
    assert response.status_code == 400
    assert "4096" in errors_of(response)["spec.resources.num_nodes"]
    assert Run.objects.count() == 0


@pytest.mark.parametrize(("section", "key", "value", "limit"), [
    ("rollout", "n_samples_per_prompt", 1e30, "less than or equal to 1024"),
    ("actor", "lr", 1e308, "less than or equal to 1"),
    ("resources", "num_nodes", 1e10, "less than or equal to 4096"),
    ("resources", "devices_per_node", 1000, "less than or equal to 64"),
    ("seed", None, 2**63, "less than 9223372036854775808"),
])
def test_it_refuses_implausible_values_saying_the_limit(submit, tiny_spec, section, key, value,
                                                        limit):
    patch = {section: {key: value}} if key else {section: value}
    response = submit(spec={**tiny_spec, **patch})
    assert response.status_code == 400
    assert limit in errors_of(response)[f"spec.{section}.{key}" if key else f"spec.{section}"]
    assert Run.objects.count() == 0


def test_it_refuses_1e30_samples_as_an_override_saying_the_limit(submit):
    response = submit(overrides=["rollout.n_samples_per_prompt=1.0e+30"])
    assert response.status_code == 400
    assert "1024" in errors_of(response)["spec.rollout.n_samples_per_prompt"]


# --------------------------------------------------------------------------- the web UI


def test_it_shows_the_anchor_error_of_the_yaml_editor_and_stores_no_run(signed_in, experiment):
    text = ("algorithm: grpo\ndata: {synthetic: {task: addition}}\nreward:\n  functions:\n"
            f"    - name: format\n      kwargs: {LAUGHS}\n")
    started = time.monotonic()
    response = signed_in("owner").post("/runs/new/", {
        "experiment": experiment.pk, "key": "k1", "mode": "yaml", "yaml": text,
        "action": "submit"})
    page = response.content.decode()
    assert response.status_code == 200 and time.monotonic() - started < 2
    assert "YAML anchors (&amp;a) are not accepted" in page and "line 6" in page
    assert Run.objects.count() == 0


def test_it_shows_the_anchor_error_of_a_form_field_and_stores_no_run(signed_in, experiment):
    response = signed_in("maintainer").post("/runs/new/", {
        "experiment": experiment.pk, "key": "k1", "mode": "form", "algorithm": "grpo",
        "spec.data.synthetic.task": "addition", "action": "submit",
        "spec.reward.functions": f"[{{name: format, kwargs: {LAUGHS}}}]"})
    page = response.content.decode()
    assert response.status_code == 200
    assert 'data-testid="error-reward.functions"' in page and "are not accepted" in page
    assert Run.objects.count() == 0


def test_it_shows_an_infinite_form_number_as_an_error(signed_in, experiment):
    response = signed_in("owner").post("/runs/new/", {
        "experiment": experiment.pk, "key": "k1", "mode": "form", "algorithm": "grpo",
        "spec.data.synthetic.task": "addition", "action": "submit", "spec.actor.lr": "inf"})
    page = response.content.decode()
    assert response.status_code == 200 and "Enter a finite number" in page
    assert Run.objects.count() == 0
