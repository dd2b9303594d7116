"""The dashboard, clusters and settings pages in the browser: runs in their sections (refreshed
live), an admin draining a node, an owner managing members and tokens, a viewer's read-only view."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from accounts.models import ApiToken
from accounts.services import invite
from clusters.models import Cluster, Node
from experiments.models import Attempt, Experiment, Run
from tests.browser.conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)

TiB = 1024**4


@pytest.fixture
def fleet(db):
    """Two clusters as the probe would leave them: Ascend nodes (one draining, one with two
    unhealthy NPUs), and a development cluster of GPU and CPU nodes with one node down."""
    now = timezone.now()
    ascend = Cluster.objects.create(
        name="ascend-sh", device_type="npu", ray_address="http://10.20.0.10:8265", status="online",
        labels={"zone": "cn-east-2", "npu_model": "ascend-910b"}, last_probe_at=now - timedelta(seconds=40))
    dev = Cluster.objects.create(
        name="dev-gpu", device_type="gpu", ray_address="http://10.30.0.5:8265", status="degraded",
        labels={"zone": "lab"}, last_probe_at=now - timedelta(minutes=2))
    seen = now - timedelta(seconds=40)
    for i, healthy, state in ((1, 8, "ready"), (2, 6, "ready"), (3, 8, "draining")):
        Node.objects.create(cluster=ascend, hostname=f"npu-sh-0{i}", address=f"10.20.0.{10 + i}",
                            device_type="ascend-910b", device_count=8, healthy_device_count=healthy,
                            cpu_count=192, memory_bytes=2 * TiB, state=state, last_seen=seen)
    Node.objects.create(cluster=dev, hostname="gpu-lab-01", address="10.30.0.11", device_type="nvidia-h100",
                        device_count=4, healthy_device_count=4, cpu_count=96, memory_bytes=TiB, last_seen=seen)
    Node.objects.create(cluster=dev, hostname="gpu-lab-02", address="10.30.0.12", device_type="nvidia-h100",
                        device_count=4, healthy_device_count=0, cpu_count=96, memory_bytes=TiB, state="down",
                        last_seen=now - timedelta(hours=3))
    Node.objects.create(cluster=dev, hostname="cpu-lab-01", address="10.30.0.21", device_type="cpu",
                        device_count=64, healthy_device_count=64, cpu_count=64,
                        memory_bytes=TiB // 2, last_seen=seen)
    return {"ascend": ascend, "dev": dev}


def make_run(experiment, owner, name, state, algorithm="grpo", device_type="npu", device_count=8,
             cluster=None, **fields) -> Run:
    run = Run.objects.create(experiment=experiment, spec={}, name=name, algorithm=algorithm,
                             device_type=device_type, device_count=device_count, state=state,
                             created_by=owner, **fields)
    if cluster is not None:  # an active attempt holds the devices
        Attempt.objects.create(run=run, number=1, ray_submission_id=f"ascent-run-{run.pk}-attempt-1",
                               cluster=cluster, device_count=device_count)
    return run


def test_the_dashboard_shows_runs_in_their_sections_and_refreshes(page, sign_in, team, fleet):
    owner, now = team["users"]["owner"], timezone.now()
    math = Experiment.objects.create(project=team["project"], name="math-reasoning", created_by=owner)
    base = team["experiment"]
    hour = timedelta(hours=1)
    make_run(math, owner, "qwen2.5-7b-gsm8k", "RUNNING", cluster=fleet["ascend"],
                       started_at=now - 2 * hour)
    make_run(base, owner, "llama-3-8b-dapo", "STARTING", "dapo", "gpu", 4, cluster=fleet["dev"],
             started_at=now - timedelta(minutes=1))
    queued = make_run(math, owner, "qwen2.5-32b-gsm8k", "QUEUED", "ppo", device_count=32, priority=10,
                      waiting_reason="Needs 32 npu devices; the most free on one cluster is 6 (ascend-sh).")
    make_run(base, owner, "dpo-ultrafeedback", "QUEUED", "dpo", "gpu", 8,
             waiting_reason="Needs 8 gpu devices; the most free on one cluster is 0 (dev-gpu).")
    failed = make_run(math, owner, "qwen2.5-7b-lr-sweep", "FAILED", started_at=now - 5 * hour,
                      finished_at=now - 3 * hour,
                      error="RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB\nTraceback ...")
    make_run(base, owner, "smoke-test", "SUCCEEDED", "grpo", "cpu", 1, finished_at=now - 4 * hour)
    Run.objects.filter(state="QUEUED").update(created_at=now - timedelta(minutes=25))  # waiting a while

    sign_in(owner)
    page.goto("/")
    expect(page.get_by_test_id("count-queued")).to_contain_text("2")
    expect(page.get_by_test_id("count-running")).to_contain_text("2")
    queue, live = page.get_by_test_id("queue"), page.get_by_test_id("running")
    expect(queue.get_by_role("link", name=f"#{queued.pk} qwen2.5-32b-gsm8k")).to_have_attribute(
        "href", f"/runs/{queued.pk}/")
    expect(queue).to_contain_text("the most free on one cluster is 6")
    expect(live).to_contain_text("qwen2.5-7b-gsm8k")
    expect(live).to_contain_text("ascend-sh")
    expect(live).not_to_contain_text("qwen2.5-32b-gsm8k")
    failures = page.get_by_test_id("failures")
    expect(failures.get_by_test_id(f"failed-{failed.pk}")).to_contain_text("RuntimeError: NPU out of memory")
    expect(failures).not_to_contain_text("Traceback")
    expect(page.get_by_test_id("capacity-ascend-sh-npu")).to_contain_text("8 used · 6 free · 24 total")
    expect(page.get_by_test_id("utilisation-dev-gpu")).to_contain_text("4 used · 0 free · 4 total")
    screenshot(page, "dashboard")

    # The running and queue section polls every 5 s: a run that starts moves over by itself.
    Run.objects.filter(pk=queued.pk).update(state="STARTING", waiting_reason="")
    expect(live.get_by_test_id(f"running-{queued.pk}")).to_be_visible(timeout=12_000)
    expect(queue).not_to_contain_text("qwen2.5-32b-gsm8k")
    page.get_by_test_id("count-queued").click()
    expect(page).to_have_url(re.compile(r"/runs/\?state=QUEUED$"))


def test_the_admin_drains_and_undrains_a_node(page, sign_in, team, fleet):
    sign_in(team["users"]["admin"])
    page.goto("/clusters/")
    node = page.get_by_test_id("node-npu-sh-01")
    expect(node.get_by_test_id("node-state-npu-sh-01")).to_have_text("Ready")
    expect(page.get_by_test_id("health-npu-sh-02")).to_have_class(re.compile("health-bad"))
    expect(page.get_by_test_id("cluster-dev-gpu")).to_contain_text("zone=lab")
    node.get_by_role("button", name="Drain npu-sh-01").click()
    expect(page.locator(".messages")).to_contain_text("Node npu-sh-01 of ascend-sh drained")
    expect(node.get_by_test_id("node-state-npu-sh-01")).to_have_text("Draining")
    assert Node.objects.get(hostname="npu-sh-01").state == "draining"
    expect(page.get_by_test_id("capacity-ascend-sh-npu")).to_contain_text("0 used · 6 free · 24 total")
    screenshot(page, "clusters")

    node.get_by_role("button", name="Undrain npu-sh-01").click()
    expect(page.locator(".messages")).to_contain_text("Node npu-sh-01 of ascend-sh undrained")
    expect(node.get_by_test_id("node-state-npu-sh-01")).to_have_text("Ready")
    assert Node.objects.get(hostname="npu-sh-01").state == "ready"


def test_the_owner_invites_a_member_and_creates_and_revokes_a_token(page, sign_in, team):
    owner, now = team["users"]["owner"], timezone.now()
    laptop, _ = ApiToken.issue(owner, "laptop", expires_at=now + timedelta(days=60))
    ApiToken.objects.filter(pk=laptop.pk).update(last_used_at=now - timedelta(hours=2))
    old, _ = ApiToken.issue(owner, "old-ci")
    old.revoke()
    # Ages as on a team's real page (created_at is set on insert).
    ApiToken.objects.filter(user=owner).update(created_at=now - timedelta(days=30))
    team["project"].memberships.update(created_at=now - timedelta(days=40))
    sign_in(owner)
    page.goto("/settings/")

    alpha = page.get_by_test_id("project-alpha")
    alpha.get_by_label("Username").fill("stranger")
    alpha.get_by_label("Role", exact=True).select_option("maintainer")
    alpha.get_by_role("button", name="Invite").click()
    expect(page.locator(".messages")).to_contain_text("Invited stranger to alpha as maintainer")
    expect(alpha.get_by_test_id("pending-alpha-stranger")).to_contain_text("Maintainer")
    expect(alpha.get_by_test_id("member-stranger")).to_have_count(0)

    page.get_by_label("Token name").fill("ci-pipeline")
    page.get_by_label("Expires in (days)").fill("30")
    page.get_by_role("button", name="Create token").click()
    secret = page.get_by_test_id("new-token")
    expect(secret).to_have_text(re.compile(r"^asc_\S{20,}$"))
    expect(page.get_by_test_id("new-token-box")).to_contain_text("shown only this once")
    expect(page.get_by_test_id("token-ci-pipeline")).to_contain_text("Active")
    raw = secret.inner_text()
    screenshot(page, "settings")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.get_by_test_id("copy-token").click()
    expect(page.get_by_test_id("copy-token")).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == raw

    page.reload()  # F5 after creating a token creates nothing and shows no secret
    expect(page.get_by_test_id("token-ci-pipeline")).to_contain_text("Active")
    expect(page.get_by_test_id("new-token")).to_have_count(0)
    assert ApiToken.objects.filter(name="ci-pipeline").count() == 1
    page.goto("/settings/")
    expect(page.get_by_test_id("new-token")).to_have_count(0)
    expect(page.locator("body")).not_to_contain_text(raw)
    row = page.get_by_test_id("token-ci-pipeline")
    row.get_by_role("button", name="Revoke ci-pipeline").click()
    expect(page.locator(".messages")).to_contain_text("Revoked the token ci-pipeline")
    expect(row).to_contain_text("Revoked")
    expect(row.get_by_role("button")).to_have_count(0)
    assert not ApiToken.objects.get(name="ci-pipeline").is_active


def test_a_viewer_sees_no_write_buttons(page, sign_in, team, fleet):
    sign_in(team["users"]["viewer"])
    page.goto("/clusters/")
    expect(page.get_by_test_id("node-npu-sh-01")).to_be_visible()
    expect(page.get_by_role("button", name=re.compile("drain", re.I))).to_have_count(0)

    page.goto("/settings/")
    alpha = page.get_by_test_id("project-alpha")
    expect(alpha.get_by_test_id("member-owner")).to_contain_text("Owner")
    # Only their own e-mail settings: nothing of the project's.
    expect(alpha.get_by_role("button")).to_have_text(["Save my e-mails"])
    expect(alpha.locator("form:not(.notify-email) select, form:not(.notify-email) input")
           ).to_have_count(0)
    expect(alpha).to_contain_text("Only its owners manage its members.")


def test_the_invitee_accepts_on_the_settings_page(page, sign_in, team):
    stranger = team["users"]["stranger"]
    invite(team["project"], "stranger", "viewer", team["users"]["owner"])
    sign_in(stranger)
    page.goto("/settings/")
    expect(page.get_by_test_id("no-projects")).to_be_visible()
    row = page.get_by_test_id("invitation-alpha")
    expect(row).to_contain_text("Viewer")
    row.get_by_role("button", name="Accept the invitation to alpha").click()
    expect(page.locator(".messages")).to_contain_text("You joined alpha as viewer.")
    expect(page.get_by_test_id("project-alpha").get_by_test_id("member-stranger")).to_be_visible()
    expect(page.get_by_test_id("invitations")).to_have_count(0)
    assert team["project"].role_of(stranger) == "viewer"


def test_the_admin_sets_a_quota_and_the_queue_says_why_a_run_waits(page, sign_in, team, fleet):
    from workers import dispatch

    owner = team["users"]["owner"]
    make_run(team["experiment"], owner, "qwen2.5-7b-gsm8k", "RUNNING", cluster=fleet["ascend"])
    waiting = make_run(team["experiment"], owner, "qwen2.5-7b-seed2", "QUEUED")
    sign_in(team["users"]["admin"])
    page.goto("/settings/")
    form = page.get_by_test_id("allocation-alpha")
    form.get_by_label("Fair-share weight").fill("2")
    form.get_by_label("npu quota").fill("8")
    form.get_by_role("button", name="Save quotas and share").click()
    expect(page.locator(".messages")).to_contain_text("Saved alpha's quotas and fair-share weight")
    devices = page.get_by_test_id("project-alpha")
    expect(devices.get_by_test_id("devices-alpha-npu")).to_contain_text("8")
    expect(devices.get_by_test_id("share-alpha")).to_contain_text("Fair-share weight 2")
    assert team["project"].device_quotas.get().devices == 8

    # The running run holds the 8: the queued one waits for the quota, and its page says so.
    assert dispatch.schedule() == []
    page.goto(f"/runs/{waiting.pk}/")
    expect(page.get_by_test_id("waiting-cause")).to_have_text("quota")
    expect(page.get_by_test_id("waiting")).to_contain_text(
        "project alpha's quota of 8 npu devices: 8 held, this run needs 8")
    page.goto("/settings/")
    expect(page.get_by_test_id("share-alpha")).to_contain_text("1 for quota")
    screenshot(page, "settings-quotas", page.get_by_test_id("project-alpha"))


def test_the_admin_adds_a_webhook_tests_it_and_a_member_subscribes_to_emails(
        page, sign_in, team):
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from notifications import services
    from notifications.models import EmailSubscription, Webhook

    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sign_in(team["users"]["admin"])
        page.goto("/settings/")
        form = page.get_by_test_id("new-webhook-alpha")
        form.get_by_label("Webhook name").fill("team-slack")
        form.get_by_label("URL").fill(f"http://127.0.0.1:{server.server_port}/hook")
        form.get_by_label("Format").select_option("slack")
        form.get_by_label("Allow a loopback or link-local address").check()
        form.get_by_role("button", name="Add webhook").click()
        secret = Webhook.objects.get().secret
        expect(page.get_by_test_id("new-webhook-secret")).to_have_text(secret)
        row = page.get_by_test_id("webhook-team-slack")
        row.get_by_role("button", name="Send a test delivery to team-slack").click()
        expect(page.locator(".messages")).to_contain_text("A test delivery to team-slack")
        services.deliver_due()  # what the worker's deliver_notifications does
        assert received and received[0]["text"].startswith("Ascent: webhook team-slack")
        page.reload()
        expect(page.get_by_test_id("webhook-team-slack")).to_contain_text("delivered")

        sign_in(team["users"]["owner"])
        page.goto("/settings/")
        email = page.get_by_test_id("email-alpha")
        email.get_by_label("failed").check()
        email.get_by_label("stalled (no step for a while)").check()
        email.get_by_role("button", name="Save my e-mails").click()
        expect(page.locator(".messages")).to_contain_text("You will get an e-mail")
        assert EmailSubscription.objects.get().events == ["run.failed", "run.stalled"]
        screenshot(page, "settings-notifications", page.get_by_test_id("notifications-alpha"))
    finally:
        server.shutdown()
