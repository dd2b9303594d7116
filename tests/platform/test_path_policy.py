"""A cluster's path policy: set by staff, enforced at submit, by placement and at launch."""

from __future__ import annotations

import json

import pytest

from clusters.models import Cluster, Node
from experiments.models import Attempt, Run
from rl_core.paths import POLICY_ENV
from workers import dispatch

NPU = {"resources": {"device_type": "npu"}}


def npu_spec(tiny_spec, **model) -> dict:
    return {**tiny_spec, **NPU, "model": {"path": "tiny:small", **model}}


def errors_of(response) -> dict[str, str]:
    return {e["field"]: e["message"] for e in response.json()["errors"]}


@pytest.fixture
def guarded(cluster):
    """npu-a accepts models under /models only, and no trust_remote_code."""
    Cluster.objects.filter(pk=cluster.pk).update(model_roots=["/models", "/shared/models"])
    cluster.refresh_from_db()
    return cluster


@pytest.fixture
def other(db):
    """npu-b: models under /other only; little free room, so best fit would prefer it."""
    other = Cluster.objects.create(name="npu-b", device_type="npu", ray_address="http://b:8265",
                                   model_roots=["/other"])
    Node.objects.create(cluster=other, hostname="b1", device_type="ascend-910b", device_count=1,
                        healthy_device_count=1)
    return other


def test_it_refuses_a_path_outside_the_named_clusters_roots(submit, guarded, tiny_spec):
    response = submit(as_="maintainer", cluster="npu-a",
                      spec=npu_spec(tiny_spec, path="/etc/secrets"))
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "invalid"
    assert errors_of(response) == {"spec.model.path": "model.path /etc/secrets is outside the "
                                   "model roots of cluster npu-a (/models, /shared/models)"}
    assert not Run.objects.exists()


def test_it_refuses_a_dotdot_escape_and_trust_remote_code(submit, guarded, tiny_spec):
    response = submit(cluster="npu-a", spec=npu_spec(tiny_spec, path="/models/../etc",
                                                      trust_remote_code=True))
    assert response.status_code == 400
    assert set(errors_of(response)) == {"spec.model.path", "spec.model.trust_remote_code"}


def test_the_dry_run_refuses_it_too(clients, guarded, tiny_spec):
    response = clients["owner"].post("/api/v1/runs/validate/", {
        "spec": npu_spec(tiny_spec, path="/etc/x"), "cluster": "npu-a"}, format="json")
    assert response.status_code == 400 and "spec.model.path" in errors_of(response)


def test_a_path_inside_the_roots_is_stored(submit, guarded, tiny_spec):
    response = submit(cluster="npu-a", spec=npu_spec(tiny_spec, path="/shared/models/./qwen"))
    assert response.status_code == 201, response.json()


def test_clusters_without_a_policy_accept_any_absolute_path(submit, cluster, tiny_spec):
    response = submit(cluster="npu-a", spec={**npu_spec(tiny_spec, path="/anywhere/m"),
                                             "data": {"train_files": ["/data/any.jsonl"]}})
    assert response.status_code == 201, response.json()


def test_relative_paths_and_unknown_tiny_names_are_refused_even_without_a_policy(
        submit, cluster, tiny_spec):
    relative = submit(cluster="npu-a", spec={**npu_spec(tiny_spec, path="/anywhere/m"),
                                             "data": {"train_files": ["relative.jsonl"]}})
    assert relative.status_code == 400
    assert "spec.data.train_files.0" in errors_of(relative)
    assert "give an absolute path on the cluster" in str(relative.json())
    tiny = submit(cluster="npu-a", spec=npu_spec(tiny_spec, path="tiny:../../etc"))
    assert tiny.status_code == 400 and "spec.model.path" in errors_of(tiny)
    assert "unknown tiny model" in str(tiny.json()) and "tiny:small" in str(tiny.json())
    assert not Run.objects.exists()


def test_an_output_dir_outside_the_roots_is_refused_at_submit(submit, cluster, tiny_spec, settings):
    Cluster.objects.filter(pk=cluster.pk).update(output_roots=["/elsewhere"])
    response = submit(cluster="npu-a", spec=npu_spec(tiny_spec))
    assert response.status_code == 400
    message = errors_of(response)["spec.trainer.output_dir"]
    assert str(settings.ASCENT_RUNS_DIR) in message and "ASCENT_RUNS_DIR" in message


def test_a_user_set_output_dir_is_replaced_so_not_refused(submit, cluster, tiny_spec, settings):
    Cluster.objects.filter(pk=cluster.pk).update(output_roots=[str(settings.ASCENT_RUNS_DIR)])
    spec = {**npu_spec(tiny_spec), "trainer": {"output_dir": "outputs/mine"}}
    assert submit(cluster="npu-a", spec=spec).status_code == 201


def test_an_unpinned_run_is_placed_only_on_a_cluster_that_allows_it(submit, guarded, other,
                                                                    tiny_spec):
    response = submit(spec=npu_spec(tiny_spec, path="/models/qwen"))
    assert response.status_code == 201, response.json()
    run_id = response.json()["id"]
    assert dispatch.schedule() == [run_id]
    assert Attempt.objects.get(run_id=run_id).cluster.name == "npu-a"  # not the best fit npu-b


def test_an_unpinned_run_no_cluster_allows_is_refused_naming_them(submit, guarded, other,
                                                                 tiny_spec):
    response = submit(spec=npu_spec(tiny_spec, path="/etc/x"))
    assert response.status_code == 400
    message = errors_of(response)["spec.model.path"]
    assert "npu-a, npu-b" in message and "/models" in message and "/other" in message
    assert not Run.objects.exists()


def test_a_queued_run_waits_when_the_policy_changes_under_it(submit, guarded, other, tiny_spec):
    run_id = submit(spec=npu_spec(tiny_spec, path="/models/qwen")).json()["id"]
    Cluster.objects.filter(pk=guarded.pk).update(model_roots=["/elsewhere"])
    assert dispatch.schedule() == []
    assert Run.objects.get(pk=run_id).waiting_reason == (
        "no cluster whose path policy allows this run has npu devices")


def test_launch_refuses_a_spec_the_policy_no_longer_allows(submit, guarded, tiny_spec):
    run_id = submit(cluster="npu-a", spec=npu_spec(tiny_spec, path="/models/qwen")).json()["id"]
    assert dispatch.schedule() == [run_id]
    Cluster.objects.filter(pk=guarded.pk).update(model_roots=["/elsewhere"])
    assert dispatch.launch(run_id) is None
    run = Run.objects.get(pk=run_id)
    assert run.state == "FAILED"
    assert run.error.startswith("path policy: model.path /models/qwen is outside")
    attempt = run.attempts.get()
    assert attempt.exit_code == 2 and attempt.launched_at is None


class _Recorder:
    """The Ray Jobs and MLflow adapters at the process boundary: what launch sends."""

    def __init__(self):
        self.submitted = []

    def submit(self, submission_id, entrypoint, runtime_env, metadata):
        self.submitted.append(runtime_env)

    def ensure_experiment(self, name, tags):
        return "1"

    def create_run(self, experiment_id, name, tags):
        return "mlflow-run"


def test_launch_passes_the_policy_to_the_job(submit, guarded, tiny_spec, monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(dispatch, "ray_jobs", lambda cluster: recorder)
    monkeypatch.setattr(dispatch, "tracking", lambda: recorder)
    run_id = submit(cluster="npu-a", spec=npu_spec(tiny_spec, path="/models/qwen")).json()["id"]
    dispatch.schedule()
    assert dispatch.launch(run_id)
    policy = json.loads(recorder.submitted[0]["env_vars"][POLICY_ENV])
    assert policy == {"cluster": "npu-a", "model_roots": ["/models", "/shared/models"],
                      "data_roots": [], "output_roots": [], "allow_trust_remote_code": False}


# --------------------------------------------------------------------------- setting it


def test_staff_set_the_policy_through_the_api_normalized(clients, cluster):
    response = clients["admin"].patch(f"/api/v1/clusters/{cluster.pk}/", {
        "model_roots": ["/models/./qwen/", "/models/qwen"], "data_roots": ["/data"],
        "allow_trust_remote_code": True}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["model_roots"] == ["/models/qwen"] and body["output_roots"] == []
    cluster.refresh_from_db()
    assert (cluster.model_roots, cluster.data_roots, cluster.allow_trust_remote_code) == (
        ["/models/qwen"], ["/data"], True)


@pytest.mark.parametrize(("persona", "status"), [("owner", 403), ("maintainer", 403),
                                                 ("viewer", 403), ("stranger", 403),
                                                 ("anonymous", 401)])
def test_only_staff_may_change_the_policy(clients, cluster, persona, status):
    response = clients[persona].patch(f"/api/v1/clusters/{cluster.pk}/", {
        "model_roots": ["/"], "allow_trust_remote_code": True}, format="json")
    assert response.status_code == status
    cluster.refresh_from_db()
    assert (cluster.model_roots, cluster.allow_trust_remote_code) == ([], False)


def test_every_user_reads_the_policy(clients, guarded):
    body = clients["viewer"].get(f"/api/v1/clusters/{guarded.pk}/").json()
    assert body["model_roots"] == ["/models", "/shared/models"]
    assert body["allow_trust_remote_code"] is False


@pytest.mark.parametrize("roots", [["models"], ["/a/../b"], "/models", [3]])
def test_a_bad_root_is_a_400_naming_the_field(clients, cluster, roots):
    response = clients["admin"].patch(f"/api/v1/clusters/{cluster.pk}/", {"model_roots": roots},
                                      format="json")
    assert response.status_code == 400
    assert [e["field"] for e in response.json()["errors"]] == ["model_roots"]


def test_the_clusters_page_shows_the_policy_read_only(users, guarded):
    from django.test import Client

    client = Client()
    client.force_login(users["viewer"])
    html = client.get("/clusters/").content.decode()
    assert "<code>/models</code> <code>/shared/models</code>" in html
    assert "any path" in html and "refused (model.trust_remote_code)" in html


def test_staff_set_the_policy_in_the_admin_normalized(users, cluster):
    from django.test import Client

    client = Client()
    users["admin"].is_superuser = True
    users["admin"].save()
    client.force_login(users["admin"])
    form = {"name": cluster.name, "device_type": "npu", "ray_address": cluster.ray_address,
            "status": "unknown", "labels": "{}", "model_roots": '["/models/./a/"]',
            "data_roots": "[]", "output_roots": '["relative"]', "nodes-TOTAL_FORMS": "0",
            "nodes-INITIAL_FORMS": "0"}
    refused = client.post(f"/admin/clusters/cluster/{cluster.pk}/change/", form)
    assert refused.status_code == 200
    assert "relative is not an absolute path" in refused.content.decode()
    form["output_roots"] = "[]"
    saved = client.post(f"/admin/clusters/cluster/{cluster.pk}/change/", form)
    assert saved.status_code == 302
    cluster.refresh_from_db()
    assert cluster.model_roots == ["/models/a"]
