"""Projects' device quotas and fair-share weights: set by staff through the API, shown to
members, and followed by the scheduler over real PostgreSQL (dispatch.schedule)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from accounts.choices import Role
from accounts.models import Membership, Project
from audit.models import AuditEntry
from experiments.models import Attempt, DeviceQuota, Experiment, Run
from workers import dispatch


@pytest.fixture
def beta(users):
    """A second project on the same cluster, with the same owner."""
    project = Project.objects.create(name="beta")
    Membership.objects.create(project=project, user=users["owner"], role=Role.OWNER)
    return Experiment.objects.create(project=project, name="sweep", created_by=users["owner"])


def url(project) -> str:
    return f"/api/v1/projects/{project.pk}/allocation/"


def one_npu(tiny_spec) -> dict:
    return {**tiny_spec, "resources": {"device_type": "npu", "devices_per_node": 1}}


def submit_many(clients, experiment, spec, count) -> list[int]:
    ids = []
    for _ in range(count):
        response = clients["owner"].post("/api/v1/runs/", {"experiment": experiment.pk,
                                                          "spec": spec}, format="json")
        assert response.status_code == 201, response.json()
        ids.append(response.json()["id"])
    return ids


def test_members_read_the_allocation_and_strangers_get_404(clients, project, cluster):
    response = clients["viewer"].get(url(project))
    assert response.status_code == 200
    assert response.json() == {"share_weight": 1.0, "quotas": {}, "held": {},
                               "healthy": {"npu": 8}, "dominant_share": 0.0, "waiting": {}}
    assert clients["stranger"].get(url(project)).status_code == 404


def test_only_staff_change_it_and_the_change_is_audited(clients, project, cluster):
    body = {"share_weight": 2.5, "quotas": {"npu": 4, "gpu": 0}}
    refused = clients["owner"].put(url(project), body, format="json")
    assert refused.status_code == 403
    assert "platform administrators" in refused.json()["detail"]
    response = clients["admin"].put(url(project), body, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["share_weight"] == 2.5
    assert response.json()["quotas"] == {"gpu": 0, "npu": 4}
    entry = AuditEntry.objects.get(action="project.allocation")
    assert entry.actor_name == "admin" and entry.project_id == project.pk
    assert entry.details["share_weight"] == "2.5"  # kept as sent
    # PATCH changes the kinds named (null removes one); PUT replaces them all.
    patched = clients["admin"].patch(url(project), {"quotas": {"gpu": None, "cpu": 64}},
                                     format="json")
    assert patched.json()["quotas"] == {"cpu": 64, "npu": 4}
    assert patched.json()["share_weight"] == 2.5
    replaced = clients["admin"].put(url(project), {"quotas": {"gpu": 8}}, format="json")
    assert replaced.json()["quotas"] == {"gpu": 8}
    assert list(DeviceQuota.objects.values_list("device_type", "devices")) == [("gpu", 8)]


@pytest.mark.parametrize("body, field, words", [
    ({"quotas": {"tpu": 4}}, "quotas", "Unknown key: did you mean 'npu'?"),
    ({"quotas": {"npu": -1}}, "quotas", "greater than or equal to 0"),
    ({"share_weight": 0}, "share_weight", "greater than or equal to 0.01"),
    ({"share_weight": 5000}, "share_weight", "less than or equal to 1000"),
    ({"weight": 2}, "weight", "did you mean 'share_weight'?"),
])
def test_bad_input_names_the_field(clients, project, body, field, words):
    response = clients["admin"].patch(url(project), body, format="json")
    assert response.status_code == 400
    errors = {e["field"]: e["message"] for e in response.json()["errors"]}
    assert field in {f.split(".")[0] for f in errors}, errors
    assert words in " ".join(errors.values()), errors
    assert Project.objects.get(pk=project.pk).share_weight == 1.0
    assert not DeviceQuota.objects.exists()


def test_admissions_follow_the_weighted_shares(clients, project, experiment, beta, cluster,
                                               tiny_spec):
    # 8 npus; alpha weight 1, beta weight 3; eight 1-npu runs each, alpha's submitted first.
    clients["admin"].patch(url(beta.project), {"share_weight": 3}, format="json")
    alpha_runs = submit_many(clients, experiment, one_npu(tiny_spec), 8)
    beta_runs = submit_many(clients, beta, one_npu(tiny_spec), 8)
    placed = set(dispatch.schedule())
    assert len(placed & set(alpha_runs)) == 2 and len(placed & set(beta_runs)) == 6
    waiting = Run.objects.filter(state="QUEUED")
    # Each side's waiting runs would have fitted had the other's not gone first.
    assert set(waiting.values_list("waiting_cause", flat=True)) == {"share"}
    reasons = {r.experiment_id: r.waiting_reason for r in waiting}
    assert reasons[experiment.pk] == ("fair share: npu devices went first to projects further "
                                      "below their share (beta); project alpha holds 2 npu "
                                      "devices at weight 1")
    assert reasons[beta.pk].endswith("(alpha); project beta holds 6 npu devices at weight 3")
    # The next pass counts what the attempts hold: the cluster is full, nobody starts.
    assert dispatch.schedule() == []
    run = clients["owner"].get(f"/api/v1/runs/{alpha_runs[-1]}/").json()
    assert run["state"] == "QUEUED" and run["waiting_cause"] == "capacity"
    beta_view = clients["owner"].get(url(beta.project)).json()
    assert beta_view["held"] == {"npu": 6}
    assert beta_view["dominant_share"] == pytest.approx(6 / 8 / 3)
    assert sum(beta_view["waiting"].values()) == 2


def test_a_quota_caps_a_project_and_lowering_it_stops_no_run(clients, project, experiment, beta,
                                                             cluster, tiny_spec):
    clients["admin"].patch(url(beta.project), {"share_weight": 3, "quotas": {"npu": 5}},
                           format="json")
    alpha_runs = submit_many(clients, experiment, one_npu(tiny_spec), 8)
    beta_runs = submit_many(clients, beta, one_npu(tiny_spec), 8)
    placed = set(dispatch.schedule())
    assert len(placed & set(alpha_runs)) == 3 and len(placed & set(beta_runs)) == 5
    quota_waits = Run.objects.filter(pk__in=beta_runs, waiting_cause="quota")
    assert quota_waits.count() == 3
    assert quota_waits.first().waiting_reason == (
        "project beta's quota of 5 npu devices: 5 held, this run needs 1")
    # Lower the quota below what beta holds: its runs go on; none of its queued ones starts
    # even when devices come free.
    clients["admin"].patch(url(beta.project), {"quotas": {"npu": 2}}, format="json")
    assert Run.objects.filter(pk__in=beta_runs, state="SCHEDULED").count() == 5
    alpha_running = Run.objects.filter(pk__in=alpha_runs, state="SCHEDULED")
    for attempt in [r.attempts.get() for r in alpha_running]:
        attempt.ended_at = timezone.now()  # alpha's three runs ended: three devices free
        attempt.save()
        Run.objects.filter(pk=attempt.run_id).update(state="SUCCEEDED")
    placed = set(dispatch.schedule())
    assert placed <= set(alpha_runs) and len(placed) == 3
    assert Run.objects.get(pk=beta_runs[-1]).waiting_reason == (
        "project beta's quota of 2 npu devices: 5 held, this run needs 1")


def section(html: str, testid: str) -> str:
    start = html.index(f'data-testid="{testid}"')
    return html[start:html.index("</table>", start)]


def test_the_settings_page_shows_quotas_and_staff_change_them(signed_in, project, cluster,
                                                              clients):
    clients["admin"].put(url(project), {"quotas": {"npu": 4}}, format="json")
    page = signed_in("viewer").get("/settings/").content.decode()
    row = section(page, "devices-alpha-npu")
    assert [cell.split(">")[-1] for cell in row.split("</td>")[:4]] == ["npu", "4", "0", "8"]
    assert 'data-testid="allocation-alpha"' not in page  # members see, only staff change
    refused = signed_in("owner").post(f"/settings/projects/{project.pk}/allocation/",
                                      {"share_weight": "5", "quota_npu": ""}, follow=True)
    assert "Only platform administrators" in refused.content.decode()
    assert Project.objects.get(pk=project.pk).share_weight == 1.0
    admin = signed_in("admin")
    assert 'data-testid="allocation-alpha"' in admin.get("/settings/").content.decode()
    bad = admin.post(f"/settings/projects/{project.pk}/allocation/",
                     {"share_weight": "2", "quota_npu": "-3"}, follow=True).content.decode()
    assert "quotas.npu: Ensure this value is greater than or equal to 0." in bad
    saved = admin.post(f"/settings/projects/{project.pk}/allocation/",
                       {"share_weight": "2", "quota_npu": "", "quota_gpu": "16"}, follow=True)
    assert "Saved alpha" in saved.content.decode()
    assert Project.objects.get(pk=project.pk).share_weight == 2.0
    assert list(DeviceQuota.objects.values_list("device_type", "devices")) == [("gpu", 16)]
    assert AuditEntry.objects.filter(action="project.allocation").count() == 2


# --- preemption ----------------------------------------------------------------------------


def start(run_ids) -> None:
    """As the worker would after a launch: the jobs run."""
    Run.objects.filter(pk__in=run_ids).update(state="RUNNING")
    Attempt.objects.filter(run_id__in=run_ids).update(launched_at=timezone.now())


def test_an_urgent_run_preempts_runs_of_a_project_above_its_share(
        clients, project, experiment, beta, cluster, tiny_spec):
    alpha_runs = submit_many(clients, experiment, one_npu(tiny_spec), 8)
    keep = Run.objects.get(pk=alpha_runs[-1])
    Run.objects.filter(pk=keep.pk).update(preemptible=False)
    assert set(dispatch.schedule()) == set(alpha_runs)
    start(alpha_runs)
    urgent = clients["admin"].post("/api/v1/runs/", {
        "experiment": beta.pk, "priority": 50,
        "spec": {**tiny_spec, "resources": {"device_type": "npu", "devices_per_node": 4}}},
        format="json").json()
    assert urgent["preemptible"] is True
    # alpha holds 8 of 8 with beta waiting: above its half. The four newest preemptible runs
    # (the last is not preemptible) are stopped; the urgent run waits for their devices.
    assert dispatch.schedule() == []
    preempting = list(Run.objects.filter(state="PREEMPTING").order_by("pk")
                      .values_list("pk", flat=True))
    assert preempting == alpha_runs[3:7]
    event = Run.objects.get(pk=preempting[0]).events.last()
    assert event.to_state == "PREEMPTING" and event.actor == "system:dispatch"
    assert event.message.startswith(f"preempted for run {urgent['id']} (priority 50, project "
                                    "beta): project alpha holds more than its share")
    audit = AuditEntry.objects.filter(action="run.preempt").order_by("object_id")
    assert [e.object_id for e in audit] == [str(pk) for pk in preempting]
    assert {e.actor_name for e in audit} == {"admin"}  # who caused it
    assert audit[0].details["for_run"] == urgent["id"]
    # Another pass stops nothing more: the devices being freed will hold the urgent run.
    assert dispatch.schedule() == []
    assert Run.objects.filter(state="PREEMPTING").count() == 4

    # The jobs saved their step and ended: back in the queue; the urgent run starts.
    for run in Run.objects.filter(pk__in=preempting):
        dispatch._requeue_preempted(run, run.attempts.get(), 143, "the Ray job stopped")
    assert dispatch.schedule() == [urgent["id"]]
    for pk in preempting:
        run = Run.objects.get(pk=pk)
        assert run.state == "QUEUED" and run.waiting_cause in ("capacity", "share")
        assert run.attempts.get().preempted and run.attempts.get().ended_at is not None
        assert "back in the queue" in run.events.last().message


def test_no_preemption_of_a_project_within_its_share(
        clients, project, experiment, beta, cluster, tiny_spec):
    alpha_runs = submit_many(clients, experiment, one_npu(tiny_spec), 4)
    beta_runs = submit_many(clients, beta, one_npu(tiny_spec), 4)
    dispatch.schedule()
    start(alpha_runs + beta_runs)
    # Each holds its half: a priority-50 run of beta stops nothing.
    clients["owner"].post("/api/v1/runs/", {"experiment": beta.pk, "priority": 50,
                                            "spec": one_npu(tiny_spec)}, format="json")
    assert dispatch.schedule() == []
    assert not Run.objects.filter(state="PREEMPTING").exists()
    assert not AuditEntry.objects.filter(action="run.preempt").exists()


def test_a_preempted_attempt_does_not_count_as_a_restart(project, experiment, cluster):
    run = Run.objects.create(experiment=experiment, spec={}, algorithm="grpo", device_type="npu",
                             device_count=1, state="PREEMPTING", max_restarts=1)
    first = Attempt.objects.create(run=run, number=1, cluster=cluster, device_count=1,
                                   ray_submission_id="ascent-run-x-attempt-1",
                                   launched_at=timezone.now())
    dispatch._requeue_preempted(run, first, 143, "the Ray job stopped")
    assert Run.objects.get(pk=run.pk).state == "QUEUED"
    second = Attempt.objects.create(run=run, number=2, cluster=cluster, device_count=1,
                                    ray_submission_id="ascent-run-x-attempt-2")
    Run.objects.filter(pk=run.pk).update(state="RUNNING")
    run.refresh_from_db()
    # attempt 2 fails: the one restart allowed is still there.
    assert dispatch.fail_or_restart(run, second, "boom", retryable=True) is True
    assert Run.objects.get(pk=run.pk).attempts.count() == 3
