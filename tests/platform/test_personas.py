"""Every endpoint, as each persona: owner, maintainer, viewer, stranger, admin (staff), anonymous.

A stranger gets 404 for a project's objects (they are invisible, not forbidden); a viewer gets 403
for writes; anonymous requests get 401. An invitation exists only for the invited user (and the
project's owners).
"""

from __future__ import annotations

import pytest

from accounts.services import invite
from experiments.services import Submission, submit_run

O, M, V, S, A, N = "owner", "maintainer", "viewer", "stranger", "admin", "anonymous"


def expect(owner, maintainer, viewer, stranger, admin, anonymous=401):
    return {O: owner, M: maintainer, V: viewer, S: stranger, A: admin, N: anonymous}


CASES = [
    # clusters and nodes: staff write, everyone signed in reads
    ("get", "/api/v1/clusters/", None, expect(200, 200, 200, 200, 200)),
    ("get", "/api/v1/clusters/{cluster}/", None, expect(200, 200, 200, 200, 200)),
    ("get", "/api/v1/clusters/{cluster}/utilisation/", None, expect(200, 200, 200, 200, 200)),
    ("post", "/api/v1/clusters/", {"name": "gpu-x", "device_type": "gpu", "ray_address": "http://x:8265"},
     expect(403, 403, 403, 403, 201)),
    ("patch", "/api/v1/clusters/{cluster}/", {"labels": {"zone": "b"}}, expect(403, 403, 403, 403, 200)),
    ("delete", "/api/v1/clusters/{cluster}/", None, expect(403, 403, 403, 403, 204)),
    ("get", "/api/v1/nodes/", None, expect(200, 200, 200, 200, 200)),
    ("post", "/api/v1/nodes/", {"cluster": "npu-a", "hostname": "n9", "device_type": "ascend-910c",
                                "device_count": 16, "healthy_device_count": 16},
     expect(403, 403, 403, 403, 201)),
    ("post", "/api/v1/nodes/{node}/drain/", None, expect(403, 403, 403, 403, 200)),
    ("post", "/api/v1/nodes/{node}/undrain/", None, expect(403, 403, 403, 403, 200)),
    # projects and members
    ("get", "/api/v1/projects/", None, expect(200, 200, 200, 200, 200)),
    ("post", "/api/v1/projects/", {"name": "beta"}, expect(201, 201, 201, 201, 201)),
    ("get", "/api/v1/projects/{project}/", None, expect(200, 200, 200, 404, 200)),
    ("patch", "/api/v1/projects/{project}/", {"description": "x"}, expect(200, 403, 403, 404, 200)),
    # (the fixture's run is unfinished, so an allowed delete is refused as a conflict)
    ("delete", "/api/v1/projects/{project}/", None, expect(409, 403, 403, 404, 409)),
    ("get", "/api/v1/projects/{project}/members/", None, expect(200, 200, 200, 404, 200)),
    ("post", "/api/v1/projects/{project}/members/", {"username": "stranger", "role": "viewer"},
     expect(202, 403, 403, 404, 202)),
    ("get", "/api/v1/projects/{project}/invitations/", None, expect(200, 403, 403, 404, 200)),
    ("delete", "/api/v1/projects/{project}/invitations/{invitation}/", None,
     expect(204, 403, 403, 404, 204)),
    # invitations: only the invited user (here the stranger) sees and answers theirs
    ("get", "/api/v1/invitations/", None, expect(200, 200, 200, 200, 200)),
    ("get", "/api/v1/invitations/{invitation}/", None, expect(404, 404, 404, 200, 404)),
    ("post", "/api/v1/invitations/{invitation}/accept/", None, expect(404, 404, 404, 200, 404)),
    ("post", "/api/v1/invitations/{invitation}/decline/", None, expect(404, 404, 404, 200, 404)),
    ("patch", "/api/v1/projects/{project}/members/viewer/", {"role": "maintainer"},
     expect(200, 403, 403, 404, 200)),
    ("delete", "/api/v1/projects/{project}/members/viewer/", None, expect(204, 403, 403, 404, 204)),
    # experiments
    ("get", "/api/v1/experiments/", None, expect(200, 200, 200, 200, 200)),
    ("get", "/api/v1/experiments/{experiment}/", None, expect(200, 200, 200, 404, 200)),
    ("post", "/api/v1/experiments/", {"project": "{project}", "name": "new"},
     expect(201, 201, 403, 400, 201)),
    ("patch", "/api/v1/experiments/{experiment}/", {"description": "d"}, expect(200, 200, 403, 404, 200)),
    ("delete", "/api/v1/experiments/{experiment}/", None, expect(409, 409, 403, 404, 409)),
    # runs
    ("get", "/api/v1/runs/", None, expect(200, 200, 200, 200, 200)),
    ("get", "/api/v1/runs/{run}/", None, expect(200, 200, 200, 404, 200)),
    ("post", "/api/v1/runs/", {"experiment": "{experiment}", "spec": "{spec}"},
     expect(201, 201, 403, 400, 201)),
    ("post", "/api/v1/runs/validate/", {"spec": "{spec}"}, expect(200, 200, 200, 200, 200)),
    ("post", "/api/v1/runs/{run}/cancel/", None, expect(200, 200, 403, 404, 200)),
    ("post", "/api/v1/runs/{run}/clone/", {}, expect(201, 201, 403, 404, 201)),
    ("get", "/api/v1/runs/{run}/events/", None, expect(200, 200, 200, 404, 200)),
    ("put", "/api/v1/runs/{run}/", {"priority": 5}, expect(405, 405, 405, 405, 405)),
    ("delete", "/api/v1/runs/{run}/", None, expect(405, 405, 405, 405, 405)),
    # the spec contract, tokens, identity
    ("get", "/api/v1/spec/schema/", None, expect(200, 200, 200, 200, 200)),
    ("get", "/api/v1/spec/presets/", None, expect(200, 200, 200, 200, 200)),
    ("get", "/api/v1/tokens/", None, expect(200, 200, 200, 200, 200)),
    ("post", "/api/v1/tokens/", {"name": "ci"}, expect(201, 201, 201, 201, 201)),
    ("get", "/api/v1/me/", None, expect(200, 200, 200, 200, 200)),
]


@pytest.fixture
def objects(project, experiment, cluster, users, tiny_spec):
    run, _ = submit_run(experiment, users[O], Submission(spec=tiny_spec))
    invitation = invite(project, "stranger", "viewer", users[O])
    return {"project": project.pk, "experiment": experiment.pk, "cluster": cluster.pk,
            "node": cluster.nodes.get().pk, "run": run.pk, "spec": tiny_spec,
            "invitation": invitation.pk}


def fill(value, objects):
    if value == "{spec}":
        return objects["spec"]
    if isinstance(value, str):
        return value.format(**objects) if value.startswith(("{", "/")) else value
    if isinstance(value, dict):
        filled = {k: fill(v, objects) for k, v in value.items()}
        return {k: int(v) if isinstance(v, str) and v.isdigit() else v for k, v in filled.items()}
    return value


@pytest.mark.parametrize("persona", [O, M, V, S, A, N])
@pytest.mark.parametrize(("method", "path", "body", "statuses"), CASES,
                         ids=[f"{c[0].upper()} {c[1]}" for c in CASES])
def test_persona_gets_the_expected_status(clients, objects, persona, method, path, body, statuses):
    client = clients[persona]
    response = getattr(client, method)(fill(path, objects), fill(body, objects), format="json")
    assert response.status_code == statuses[persona], response.content[:400]
    if response.status_code >= 400:
        assert {"error", "detail"} <= set(response.json())


def test_lists_show_only_what_the_persona_may_see(clients, objects):
    for persona, visible in ((O, 1), (V, 1), (S, 0), (A, 1)):
        for path in ("/api/v1/projects/", "/api/v1/experiments/", "/api/v1/runs/"):
            assert len(clients[persona].get(path).json()["results"]) == visible, (persona, path)


@pytest.mark.parametrize(("persona", "named", "counted"), [
    (O, 1, 0), (M, 1, 0), (V, 1, 0), (S, 0, 1), (A, 1, 0)])
def test_utilisation_names_only_the_runs_the_persona_may_see(clients, objects, cluster, persona,
                                                             named, counted):
    from experiments.models import Run

    Run.objects.filter(pk=objects["run"]).update(state="RUNNING", cluster=cluster, device_count=8)
    body = clients[persona].get(f"/api/v1/clusters/{cluster.pk}/utilisation/").json()
    assert [r["id"] for r in body["runs"]] == [objects["run"]] * named
    assert body["other_runs"] == {"count": counted, "device_count": 8 * counted}
