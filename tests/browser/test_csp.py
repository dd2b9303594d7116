"""Every page of the web UI in a real browser under its Content-Security-Policy: the header is
sent, and the browser reports no violation (an inline script or style, a style attribute, a
source from elsewhere) while the page loads, draws its charts and updates itself with htmx."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from clusters.models import Cluster, Node
from experiments.models import Attempt, Run

pytestmark = pytest.mark.django_db(transaction=True)

# Runs in every page before its own scripts: each violation is reported to the test.
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", event => window.reportCspViolation(
  `${event.violatedDirective} refused ${event.blockedURI || "inline code"} ` +
  `(${event.sourceFile || location.pathname}:${event.lineNumber})`));
"""
METRICS = {"reward/mean": [0.1, 0.3, 0.5, 0.6], "actor/pg_loss": [0.9, 0.7, 0.4, 0.3],
           "response_length/mean": [4.0, 4.0, 3.5, 3.0]}


class Violations:
    """What the browser refused on the pages of one test, from both of its reports."""

    def __init__(self, page):
        self.seen: list[str] = []
        page.expose_function("reportCspViolation", lambda text: self.seen.append(text))
        page.add_init_script(REPORT_VIOLATIONS)
        page.on("console", lambda m: "Content Security Policy" in m.text and self.seen.append(
            f"console: {m.text}"))


@pytest.fixture
def violations(page) -> Violations:
    return Violations(page)


@pytest.fixture
def tracked_runs(team, mlflow_server, settings) -> list[Run]:
    """Two succeeded runs whose metrics are in the test MLflow server."""
    from mlflow import MlflowClient

    settings.MLFLOW_TRACKING_URI = mlflow_server
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment_id = client.create_experiment(f"csp-{team['experiment'].pk}")
    runs = []
    for name, scale in (("charted", 1.0), ("charted again", 0.5)):
        mlflow_run_id = client.create_run(experiment_id).info.run_id
        for key, values in METRICS.items():
            for step, value in enumerate(values, start=1):
                client.log_metric(mlflow_run_id, key, value * scale, step=step)
        client.set_terminated(mlflow_run_id)
        runs.append(Run.objects.create(
            experiment=team["experiment"], spec={"seed": int(10 * scale)}, algorithm="grpo",
            device_type="cpu", device_count=1, state="SUCCEEDED", name=name,
            created_by=team["users"]["owner"], mlflow_run_id=mlflow_run_id))
    return runs


@pytest.fixture
def busy_cluster(team) -> Cluster:
    """A cluster with 2 of its 8 NPUs held by a running run and 2 unhealthy: bars of 25%."""
    cluster = Cluster.objects.create(name="npu-csp", device_type="npu",
                                     ray_address="http://10.0.0.1:8265", status="online")
    Node.objects.create(cluster=cluster, hostname="npu-01", device_type="ascend-910b",
                        device_count=8, healthy_device_count=6, cpu_count=192)
    run = Run.objects.create(experiment=team["experiment"], spec={}, algorithm="grpo",
                             device_type="npu", device_count=2, state="RUNNING", name="holds two",
                             created_by=team["users"]["owner"], cluster=cluster)
    Attempt.objects.create(run=run, number=1, ray_submission_id=f"ascent-run-{run.pk}-attempt-1",
                           cluster=cluster, device_count=2)
    return cluster


def visit(page, url: str, status: int = 200):
    response = page.goto(url)
    assert response.status == status, url
    policy = response.headers.get("content-security-policy", "")
    assert "default-src 'self'" in policy and "script-src 'self'" in policy, (url, policy)
    assert "frame-ancestors 'none'" in policy and "'unsafe-inline'" not in policy, (url, policy)
    return response


def capacity_bars_are_drawn(page) -> None:
    bars = page.locator("[data-testid='capacity-npu-csp-npu'] .bar > span")
    expect(bars.nth(0)).to_have_attribute("style", re.compile(r"width: 25%"))
    expect(bars.nth(1)).to_have_attribute("style", re.compile(r"width: 25%"))


def test_the_ui_pages_keep_to_the_policy(page, sign_in, team, tracked_runs, busy_cluster,
                                         console, violations):
    tracked_run = tracked_runs[0]
    visit(page, "/sign-in/")
    expect(page.get_by_role("button", name="Sign in")).to_be_visible()
    sign_in(team["users"]["owner"])

    visit(page, "/")
    capacity_bars_are_drawn(page)
    page.evaluate("""() => new Promise(done => document.body.addEventListener(
        "htmx:afterSettle", done, {once: true}))""")  # the dashboard's live part, swapped in
    capacity_bars_are_drawn(page)

    visit(page, "/runs/")
    expect(page.get_by_test_id(f"run-row-{tracked_run.pk}")).to_be_visible()

    visit(page, "/runs/new/")
    page.get_by_role("tab", name="YAML").click()
    expect(page.get_by_test_id("yaml")).to_have_value(re.compile(r"algorithm: grpo"))

    visit(page, f"/runs/{tracked_run.pk}/")
    expect(page.locator("#charts")).to_have_attribute("data-loaded", "true")
    expect(page.locator("#charts .chart[data-points='4']").first).to_be_visible()
    expect(page.locator("#charts .uplot").first).to_be_visible()

    visit(page, f"/compare/?runs={tracked_runs[0].pk},{tracked_runs[1].pk}")
    expect(page.locator("#compare-charts")).to_have_attribute("data-loaded", "true")
    expect(page.locator("#compare-charts .uplot").first).to_be_visible()

    visit(page, "/clusters/")
    capacity_bars_are_drawn(page)
    visit(page, "/settings/")

    console.expect(r"status of 404")  # the browser reports the page's own status
    visit(page, "/no-such-page/", status=404)
    expect(page.get_by_test_id("not-found")).to_be_visible()
    assert violations.seen == []


def test_the_api_docs_work_under_their_own_policy(page, sign_in, team, console, violations):
    sign_in(team["users"]["owner"])
    response = visit(page, "/api/docs/")
    nonce = re.search(r"script-src 'self' 'nonce-([^']+)'",
                      response.headers["content-security-policy"])
    assert nonce, response.headers["content-security-policy"]
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Ascent API")
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible()
    assert violations.seen == []
