"""What a run page shows beyond its curves, in a real browser: chart smoothing, a log scale and
a wall-clock axis; the node's resources while the run trained; tags and a note that find the
run again; projects and experiments made on the settings page; log lines with emoji.

Resource samples are real: CPU and memory from rl_core's tracker sampling this machine into
the test MLflow server, and NVIDIA GPU samples recorded on an H200 by
tests/training/test_gpu_metrics.py (no GPU here), replayed into the same run."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from playwright.sync_api import expect

from accounts.models import Project
from clusters.models import Cluster
from experiments.models import Attempt, Experiment, LogChunk, Run
from tests.browser.conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)
RECORDED_GPU = Path(__file__).parent / "recorded" / "h200_system_metrics.json"
# (step, value) of a noisy reward and a KL that starts at 0, one step every 30 s
REWARD = [0.1, 0.5, 0.2, 0.6, 0.3, 0.7, 0.4, 0.8]
KL = [0.0, 0.01, 0.02, 0.04, 0.03, 0.05, 0.06, 0.05]
STEP_MS = 30_000


@pytest.fixture
def timed(team, mlflow_server, settings):
    """timed(name, {key: values}, step_ms): a run whose metrics were logged at steps 1.., one
    every `step_ms` (explicit MLflow timestamps, the last one now), as a training process logs
    them."""
    settings.MLFLOW_TRACKING_URI = mlflow_server
    client = MlflowClient(mlflow_server)
    experiment_id = client.create_experiment(f"timed-{time.time_ns()}")

    def make(name: str, metrics: dict[str, list[float]], step_ms: int = STEP_MS) -> Run:
        start = int(time.time() * 1000) - step_ms * max(map(len, metrics.values()))
        mlflow_run_id = client.create_run(experiment_id, run_name=name).info.run_id
        client.log_batch(mlflow_run_id, metrics=[
            Metric(key, value, start + step * step_ms, step)
            for key, values in metrics.items() for step, value in enumerate(values, start=1)])
        client.set_terminated(mlflow_run_id)
        return Run.objects.create(
            experiment=team["experiment"], algorithm="grpo", device_type="cpu", device_count=1,
            name=name, created_by=team["users"]["owner"], mlflow_run_id=mlflow_run_id,
            state="SUCCEEDED", spec={"model": {"path": "tiny:nano"}})

    return make


def debiased_ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing, written out: an exponential moving average divided by
    (1 - weight**n) so the first points are not pulled towards 0."""
    out, last = [], 0.0
    for n, value in enumerate(values, start=1):
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight ** n))
    return out


def plotted(page, testid: str) -> dict:
    """What uPlot draws in the chart: its series labels, y values, x values, x axis label and
    y scale kind (3: logarithmic)."""
    return page.evaluate("""id => {
        const u = document.querySelector(`[data-testid="${id}"]`)._uplot;
        return {labels: u.series.slice(1).map(s => s.label), x: u.data[0],
                ys: u.data.slice(1), axis: u.axes[0].label, distr: u.scales.y.distr};
    }""", testid)


def test_smoothing_a_log_scale_and_a_wall_clock_axis(timed, page, team, sign_in):
    run = timed("noisy", {"reward/mean": REWARD, "actor/kl_loss": KL})
    sign_in(team["users"]["owner"])
    page.goto(f"/runs/{run.pk}/")
    reward, kl = page.get_by_test_id("chart-0"), page.get_by_test_id("chart-1")
    expect(reward).to_have_attribute("data-points", "8", timeout=20_000)
    assert plotted(page, "chart-0") == {"labels": ["reward/mean"], "x": list(range(1, 9)),
                                        "ys": [REWARD], "axis": "step", "distr": 1}

    page.get_by_test_id("smoothing").first.fill("0.6")
    drawn = plotted(page, "chart-0")
    assert drawn["labels"] == ["reward/mean (as logged)", "reward/mean"]
    assert drawn["ys"][0] == REWARD
    assert drawn["ys"][1] == pytest.approx(debiased_ema(REWARD, 0.6))
    expect(reward.locator(".u-legend .raw")).to_be_hidden()  # the faint line has no legend row
    # the text summary and the table keep the values as logged
    expect(reward.get_by_test_id("chart-summary")).to_contain_text("last 0.8 at step 8, min 0.1")

    page.get_by_test_id("log-scale").first.check()
    assert plotted(page, "chart-0")["distr"] == 3
    expect(kl.locator("[data-chart-note]")).to_have_text("1 value ≤ 0 not drawn on the log scale.")
    assert plotted(page, "chart-1")["x"][0] == 2  # step 1's 0 is left out

    page.get_by_test_id("x-axis").first.select_option("time")
    drawn = plotted(page, "chart-0")
    assert drawn["axis"] == "time since start"
    assert drawn["x"] == [step * 30 for step in range(8)]  # seconds since the first value
    expect(reward.get_by_test_id("chart-summary")).to_contain_text("last 0.8 at 3:30")
    expect(reward.locator(".u-legend")).to_contain_text("3:30")  # the x value of the latest point
    screenshot(page, "run-chart-controls", page.locator("#charts").locator(".."))

    # the view is this browser's choice: it holds after a reload, on the compare page too
    page.reload()
    expect(page.get_by_test_id("chart-0")).to_have_attribute("data-points", "8", timeout=20_000)
    expect(page.get_by_test_id("x-axis").first).to_have_value("time")
    assert plotted(page, "chart-0")["distr"] == 3
    other = timed("other", {"reward/mean": REWARD[::-1]})
    page.goto(f"/compare/?runs={run.pk},{other.pk}&metric=reward/mean")
    expect(page.get_by_test_id("log-scale")).to_be_checked()
    expect(page.locator("#compare-charts")).to_have_attribute("data-loaded", "true")
    assert plotted(page, "compare-chart-reward/mean")["axis"] == "time since start"
    page.get_by_test_id("smoothing").fill("0")
    page.get_by_test_id("log-scale").uncheck()
    page.get_by_test_id("x-axis").select_option("step")
    drawn = plotted(page, "compare-chart-reward/mean")
    assert (drawn["axis"], drawn["distr"], len(drawn["labels"])) == ("step", 1, 2)


def replay_gpu(client: MlflowClient, mlflow_run_id: str, start_ms: int) -> dict[str, list]:
    """The H200 recording's GPU samples, logged into the run from `start_ms` on."""
    recording = json.loads(RECORDED_GPU.read_text())
    metrics = [Metric(key, value, start_ms + offset_ms, step)
               for key, points in recording["metrics"].items() if "/gpu_" in key
               for step, value, offset_ms in points]
    client.log_batch(mlflow_run_id, metrics=metrics)
    return recording


def test_the_resources_of_the_node_are_charted_against_time(timed, page, team, sign_in, mlflow_server,
                                                            tmp_path):
    from rl_core.spec import resolve_spec
    from rl_core.tracking import make_tracker

    run = timed("measured", {"reward/mean": REWARD}, step_ms=1000)
    # the training process's own sampler, on this machine, into the same MLflow run
    spec = resolve_spec({"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}},
                         "tools": {"monitor": {"system_metrics_interval": 0.2}}})
    client = MlflowClient(mlflow_server)
    client.update_run(run.mlflow_run_id, status="RUNNING")
    tracker = make_tracker(spec, tmp_path, environ={"MLFLOW_TRACKING_URI": mlflow_server,
                                                    "MLFLOW_RUN_ID": run.mlflow_run_id})
    time.sleep(1.5)
    tracker.finish()
    recording = replay_gpu(client, run.mlflow_run_id, int(time.time() * 1000))
    plain = timed("unmeasured", {"reward/mean": REWARD})
    sign_in(team["users"]["owner"])

    page.goto(f"/runs/{run.pk}/")
    resources = page.locator("#resources")
    cpu, memory = page.get_by_test_id("resource-chart-0"), page.get_by_test_id("resource-chart-1")
    gpu, gpu_memory = page.get_by_test_id("resource-chart-2"), page.get_by_test_id("resource-chart-3")
    expect(page.locator("#resource-charts")).to_have_attribute("data-loaded", "true", timeout=20_000)
    for chart in (cpu, memory, gpu, gpu_memory):
        expect(chart).to_be_visible()
        assert int(chart.get_attribute("data-points")) >= 2
    assert plotted(page, "resource-chart-0")["axis"] == "time since start"  # always, whatever the view
    expect(cpu.get_by_test_id("chart-summary")).to_contain_text("system/cpu_utilization_percentage: last ")
    busiest = max(v for _, v, _ in recording["metrics"]["system/gpu_0_utilization_percentage"])
    expect(gpu.get_by_test_id("chart-summary")).to_contain_text(f"max {busiest:g}")
    expect(page.get_by_test_id("no-resources")).to_be_hidden()
    screenshot(page, "run-resources", resources)

    page.goto(f"/runs/{plain.pk}/")
    expect(page.get_by_test_id("no-resources")).to_be_visible(timeout=20_000)
    expect(page.get_by_test_id("resource-chart-0")).to_be_hidden()


def test_tags_and_a_note_are_edited_on_the_run_page_and_find_the_run(timed, page, team, sign_in,
                                                                     console):
    console.expect(r"status of 400 .*/notes/")  # the refused form, shown again
    run = timed("tagged", {"reward/mean": REWARD})
    timed("untagged", {"reward/mean": REWARD})
    sign_in(team["users"]["maintainer"])
    page.goto(f"/runs/{run.pk}/")
    notes = page.get_by_test_id("notes")
    expect(notes.get_by_test_id("run-tags")).to_have_text("No tags yet.")

    notes.get_by_test_id("edit-notes").click()
    notes.get_by_label("Tags").fill("paper, " + "x" * 41)
    notes.get_by_label("Note").fill("Clip ratio 0.28 holds the entropy up.")
    notes.get_by_role("button", name="Save").click()
    # refused at its field, with what was typed kept and described to assistive technology
    expect(page.get_by_label("Tags")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_test_id("error-tags")).to_contain_text("no more than 40 characters")
    expect(page.get_by_label("Note")).to_have_value("Clip ratio 0.28 holds the entropy up.")

    page.get_by_label("Tags").fill("paper, clip-high")
    page.get_by_role("button", name="Save").click()
    expect(page).to_have_url(re.compile(rf"/runs/{run.pk}/#notes$"))
    expect(page.get_by_test_id("run-tags").get_by_role("link")).to_have_text(["clip-high", "paper"])
    expect(page.get_by_test_id("run-note")).to_have_text("Clip ratio 0.28 holds the entropy up.")
    page.reload()  # post/redirect/get: a reload sends nothing again
    expect(page.get_by_text("tags and note saved")).to_have_count(0)
    screenshot(page, "run-notes", page.get_by_test_id("notes"))

    page.get_by_test_id("run-tags").get_by_role("link", name="paper").click()
    expect(page).to_have_url(re.compile(r"/runs/\?tag=paper$"))
    rows = page.get_by_test_id("runs-table").locator("tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("tagged")
    page.get_by_label("Tag").select_option("")  # the filter form clears it
    expect(rows).to_have_count(2)
    page.get_by_test_id("sort-run").click()
    expect(page.locator("th[aria-sort=ascending]")).to_have_text("Run ▲")
    expect(rows.first).to_contain_text("tagged")
    page.get_by_test_id("sort-run").click()
    expect(page.locator("th[aria-sort=descending]")).to_have_text("Run ▼")
    expect(rows.first).to_contain_text("untagged")
    screenshot(page, "runs-sorted")


def test_a_new_user_makes_a_project_and_an_experiment_and_can_submit_to_it(page, team, sign_in,
                                                                         console):
    console.expect(r"status of 400 .*/settings/projects/new/")  # the refused form, shown again
    sign_in(team["users"]["stranger"])
    page.goto("/runs/new/")
    page.get_by_role("link", name="create a project and an experiment in Settings").click()
    form = page.get_by_test_id("new-project")
    form.get_by_label("Name", exact=True).fill("Math RL")
    form.get_by_role("button", name="Create project").click()
    expect(page.get_by_test_id("error-new-project-name")).to_contain_text("lowercase letters")
    expect(form.get_by_label("Name", exact=True)).to_have_value("Math RL")
    expect(form.get_by_label("Name", exact=True)).to_have_attribute("aria-invalid", "true")
    form.get_by_label("Name", exact=True).fill("math-rl")
    form.get_by_role("button", name="Create project").click()

    card = page.get_by_test_id("project-math-rl")
    expect(card).to_contain_text("stranger")
    expect(card.get_by_test_id("role-stranger")).to_have_text("Owner")
    card.get_by_label("New experiment").fill("gsm8k-grpo")
    card.get_by_role("button", name="Create experiment").click()
    expect(page.get_by_test_id("experiment-math-rl-gsm8k-grpo")).to_be_visible()
    screenshot(page, "settings-projects", page.get_by_test_id("project-math-rl"))
    assert Experiment.objects.get(name="gsm8k-grpo").project == Project.objects.get(name="math-rl")

    page.goto("/runs/new/")
    expect(page.locator("select[name=experiment]")).to_have_value(
        str(Experiment.objects.get(name="gsm8k-grpo").pk))


def test_log_emoji_are_drawn_with_the_served_emoji_font(page, team, sign_in):
    cluster = Cluster.objects.create(name="local", device_type="cpu", ray_address="http://127.0.0.1:1")
    run = Run.objects.create(experiment=team["experiment"], algorithm="grpo", device_type="cpu",
                             device_count=1, name="emoji", created_by=team["users"]["owner"],
                             state="SUCCEEDED", spec={"model": {"path": "tiny:nano"}})
    attempt = Attempt.objects.create(run=run, number=1, cluster=cluster, device_count=1,
                                     ray_submission_id="ascent-run-emoji-attempt-1")
    text = "🏃 View run emoji at: http://127.0.0.1:5000/#/runs/x\n🧪 View experiment at: http://h/\n"
    LogChunk.objects.create(attempt=attempt, offset=0, text=text)
    Attempt.objects.filter(pk=attempt.pk).update(log_offset=len(text))
    sign_in(team["users"]["owner"])

    page.goto(f"/runs/{run.pk}/")
    expect(page.get_by_test_id("log")).to_contain_text("🏃 View run emoji", timeout=20_000)
    faces = page.evaluate("""async () => {
        const faces = await document.fonts.load("12.5px 'Noto Color Emoji'", "🏃🧪");
        return faces.map(f => f.family);
    }""")
    assert faces and set(faces) == {"Noto Color Emoji"}, faces
    assert page.evaluate("document.fonts.check(\"12.5px 'Noto Color Emoji'\", '🏃')")
