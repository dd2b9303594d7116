"""The web UI and the REST API apply the same run rules: one set of bounds, the same error at the
same field for a bad submission, and one run filter for their run lists."""

from __future__ import annotations

import ast
import html
import re
from pathlib import Path

import pytest

from api.serializers import CloneSerializer, RunSubmitSerializer
from clusters.models import Cluster
from experiments.limits import MAX_RESTARTS, PRIORITY
from experiments.models import Experiment, Run

ROOT = Path(__file__).resolve().parents[2]
ERROR = re.compile(r'data-testid="error-([^"]+)">([^<]*)<')

pytestmark = pytest.mark.django_db


def ui_form(experiment, **fields) -> dict:
    """A filled submit form: the synthetic addition task, sent as a real submit."""
    return {"experiment": experiment.pk, "key": "parity", "mode": "form", "algorithm": "grpo",
            "spec.data.synthetic.task": "addition", "action": "submit", **fields}


def ui_errors(page: str) -> dict[str, str]:
    """The form's field errors by field: `priority`, `cluster`, ... and `spec.<path>`."""
    names = {"experiment", "cluster", "priority", "max_restarts"}
    return {(name if name in names else f"spec.{name}"): html.unescape(message).strip()
            for name, message in ERROR.findall(page)}


def api_errors(response) -> dict[str, str]:
    assert response.status_code == 400, response.json()
    return {e["field"]: e["message"] for e in response.json()["errors"]}


def nested(dotted: dict[str, object]) -> dict:
    """{"resources.device_type": "gpu"} as {"resources": {"device_type": "gpu"}}."""
    tree: dict = {}
    for path, value in dotted.items():
        *parents, leaf = path.split(".")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return tree


# (what is wrong, top-level API fields, spec fields, the field both must name)
BAD_SUBMISSIONS = [
    ("priority above the range", {"priority": 101}, {}, "priority"),
    ("priority below the range", {"priority": -101}, {}, "priority"),
    ("priority not a number", {"priority": "high"}, {}, "priority"),
    ("too many restarts", {"max_restarts": 21}, {}, "max_restarts"),
    ("negative restarts", {"max_restarts": -1}, {}, "max_restarts"),
    ("a cluster of another device kind", {"cluster": "npu-a"}, {"resources.device_type": "gpu"},
     "cluster"),
    ("a bad spec field", {}, {"actor.lr": -1}, "spec.actor.lr"),
]


@pytest.mark.parametrize(("top", "spec", "field"), [case[1:] for case in BAD_SUBMISSIONS],
                         ids=[case[0] for case in BAD_SUBMISSIONS])
def test_it_names_the_same_field_with_the_same_message(clients, login, experiment, cluster,
                                                       tiny_spec, top, spec, field):
    body = {"experiment": experiment.pk, "spec": {**tiny_spec, **nested(spec)}, **top}
    api = api_errors(clients["owner"].post("/api/v1/runs/", body, format="json"))
    form = {**{k: str(v) for k, v in top.items()}, **{f"spec.{k}": str(v) for k, v in spec.items()}}
    if "cluster" in top:
        form["cluster"] = str(Cluster.objects.get(name=top["cluster"]).pk)
    response = login("owner").post("/runs/new/", ui_form(experiment, **form))
    assert response.status_code == 200 and Run.objects.count() == 0
    ui = ui_errors(response.content.decode())
    assert field in api and api[field] == ui.get(field), (api, ui)


@pytest.mark.parametrize("action", ["submit", "dry_run"])
def test_a_form_pinning_a_cluster_of_another_kind_shows_the_apis_error(login, experiment, cluster,
                                                                      action):
    response = login("maintainer").post("/runs/new/", ui_form(
        experiment, action=action, cluster=str(cluster.pk), **{"spec.resources.device_type": "gpu"}))
    assert response.status_code == 200 and Run.objects.count() == 0
    error = ui_errors(response.content.decode())["cluster"]
    assert error.startswith("Cluster npu-a provides npu devices but the spec asks for gpu")
    assert "resources.device_type=npu" in error  # the way out, as the API says it


def test_the_bounds_are_one_definition(login, experiment):
    priority, restarts = Run._meta.get_field("priority"), Run._meta.get_field("max_restarts")
    assert sorted(v.limit_value for v in priority.validators) == [PRIORITY.low, PRIORITY.high]
    assert MAX_RESTARTS.high in [v.limit_value for v in restarts.validators]
    assert (priority.default, restarts.default) == (PRIORITY.default, MAX_RESTARTS.default)
    fields = RunSubmitSerializer().fields
    for name, bounds in (("priority", PRIORITY), ("max_restarts", MAX_RESTARTS)):
        assert (fields[name].min_value, fields[name].max_value) == (bounds.low, bounds.high)
    clone = CloneSerializer().fields["priority"]
    assert (clone.min_value, clone.max_value) == (PRIORITY.low, PRIORITY.high)
    page = login("owner").get("/runs/new/").content.decode()
    for name, bounds in (("priority", PRIORITY), ("max_restarts", MAX_RESTARTS)):
        tag = re.search(rf'<input name="{name}"[^>]*>', page).group(0)
        assert f'min="{bounds.low}"' in tag and f'max="{bounds.high}"' in tag, tag
    docs = (ROOT / "docs" / "api.md").read_text()
    assert f"`priority` is {PRIORITY.low}…{PRIORITY.high}" in docs
    assert f"`max_restarts` {MAX_RESTARTS.low}…{MAX_RESTARTS.high}" in docs


def run_ids_in(page: str) -> set[int]:
    return {int(pk) for pk in re.findall(r'data-testid="run-row-(\d+)"', page)}


@pytest.fixture
def runs(experiment, users, tiny_spec):
    other = Experiment.objects.create(project=experiment.project, name="sweep lr")
    made = {}
    for name, exp, state, algorithm, creator in (
            ("lr sweep a", experiment, "QUEUED", "grpo", "owner"),
            ("lr sweep b", other, "FAILED", "ppo", "maintainer"),
            ("baseline 7", experiment, "RUNNING", "grpo", "maintainer"),
            ("dpo pairs", other, "CANCELLED", "dpo", "owner")):
        made[name] = Run.objects.create(experiment=exp, name=name, spec=tiny_spec, state=state,
                                        algorithm=algorithm, device_type="cpu", device_count=1,
                                        created_by=users[creator])
    return made


def test_the_api_and_the_runs_page_list_the_same_runs_for_the_same_filters(clients, login, runs):
    some = runs["baseline 7"]
    filters = [
        {}, {"state": "FAILED"}, {"experiment": str(some.experiment_id)}, {"creator": "owner"},
        {"algorithm": "grpo"}, {"search": "sweep"}, {"search": "LR B"}, {"search": f"#{some.pk}"},
        {"search": "sweep", "creator": "maintainer"}, {"search": "nothing matches"},
    ]
    page = login("viewer")
    for query in filters:
        api = clients["viewer"].get("/api/v1/runs/", query)
        assert api.status_code == 200, api.json()
        ui_query = {("q" if k == "search" else k): v for k, v in query.items()}
        ui = run_ids_in(page.get("/runs/", ui_query).content.decode())
        assert {r["id"] for r in api.json()["results"]} == ui, query
    # `search` matches a run's experiment too: "sweep lr" is the experiment of "dpo pairs"
    found = clients["viewer"].get("/api/v1/runs/", {"search": "pairs lr"}).json()["results"]
    assert [r["name"] for r in found] == ["dpo pairs"]


def test_a_value_the_api_refuses_filters_nothing_on_the_page(clients, login, runs):
    assert clients["viewer"].get("/api/v1/runs/", {"experiment": "abc"}).status_code == 400
    page = login("viewer").get("/runs/", {"experiment": "abc"})
    assert page.status_code == 200 and run_ids_in(page.content.decode()) == {
        r.pk for r in runs.values()}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module} | {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}


def test_the_ui_takes_run_rules_from_the_domain_not_from_the_api():
    modules = {path.relative_to(ROOT).as_posix(): imports_of(path)
               for path in (ROOT / "frontend").rglob("*.py")}
    for name in ("frontend/views/common.py", "frontend/views/submit.py"):
        assert not {m for m in modules[name] if m == "api" or m.startswith("api.")}, name
    users = [name for name, imported in modules.items()
             if imported & {"api.filters", "api.serializers"} and name != "frontend/views/settings.py"]
    assert not users, users  # settings.py reuses the API's token and member serializers
