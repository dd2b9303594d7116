"""The run pages in a real browser: submit through the form and watch the run succeed with its
charts, logs and checkpoints; clone it and compare both; cancel a running run; bad input.

The end-to-end tests run the whole platform: this live server, a Celery worker process, a Ray
head and an MLflow server (tests/stack.py)."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import expect

from experiments import services
from experiments.models import Run
from tests.browser.conftest import screenshot
from tests.stack import tiny_run

RUN_TIMEOUT_MS = 240_000
TINY_YAML = """\
algorithm: grpo
name: {name}
seed: 3
model:
  path: tiny:nano
data:
  synthetic: {{task: addition, digits: 1, num_train: 32, num_val: 0}}
  prompt_template: plain
  train_batch_size: 4
rollout: {{n_samples_per_prompt: 4, max_new_tokens: 4}}
actor: {{lr: 0.001, ppo_mini_batch_size: 4, ppo_micro_batch_size: 16}}
reward:
  functions: [{{name: exact_match}}]
trainer: {{total_steps: {steps}, save_every: 2}}
"""


def field(page, path: str):
    return page.locator(f'[name="spec.{path}"]')


def open_section(page, name: str) -> None:
    section = page.locator(f'details[data-section="{name}"]')
    if section.get_attribute("open") is None:
        section.locator("summary").click()


def wait_for_state(page, state: str, timeout: int = RUN_TIMEOUT_MS) -> None:
    expect(page.locator("#run-status")).to_have_attribute("data-state", state, timeout=timeout)


def test_submit_watch_clone_and_compare(page, team, sign_in, worker, local_cluster):
    sign_in(team["users"]["owner"])
    page.goto("/runs/new/")
    expect(page.get_by_role("radio", name=re.compile("^GRPO"))).to_be_checked()
    page.get_by_label("Run name").fill("first")
    field(page, "model.path").fill("tiny:nano")
    field(page, "trainer.total_steps").fill("4")
    screenshot(page, "submit")

    # The YAML view holds the same content; the full tiny spec is typed there.
    page.get_by_role("tab", name="YAML").click()
    yaml_box = page.get_by_test_id("yaml")
    expect(yaml_box).to_have_value(re.compile(r"path: tiny:nano"))
    expect(yaml_box).to_have_value(re.compile(r"total_steps: 4"))
    yaml_box.fill(TINY_YAML.format(name="ui grpo", steps=4))
    page.get_by_role("button", name="Dry run").click()
    expect(page.get_by_test_id("device-request")).to_contain_text("1 × cpu")
    expect(page.get_by_test_id("dry-run").locator("tr", has_text="local")).to_contain_text("yes")
    assert Run.objects.count() == 0
    page.get_by_role("button", name="Submit run").click()

    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
    first = Run.objects.get()

    # Clone it at once (a run can be cloned in any state), so both run side by side on the
    # head's 2 CPUs: the form comes back with what differs from the preset; change the
    # learning rate.
    page.get_by_test_id("clone").click()
    expect(page.get_by_label("Run name")).to_have_value("ui grpo (clone)")
    expect(field(page, "model.path")).to_have_value("tiny:nano")
    field(page, "actor.lr").fill("0.002")
    page.get_by_role("button", name="Submit run").click()
    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
    second = Run.objects.exclude(pk=first.pk).get()
    # the clone is the source's resolved spec with the one change, and it links back to it
    expected = {**first.spec, "name": "ui grpo (clone)",
                "actor": {**first.spec["actor"], "lr": 0.002}}
    assert second.spec == expected and second.cloned_from_id == first.pk
    expect(page.locator("#run-status dd", has_text=f"run #{first.pk}")).to_have_count(1)

    page.goto(f"/runs/{first.pk}/")
    wait_for_state(page, "SUCCEEDED")
    first.refresh_from_db()
    expect(page.get_by_test_id("timeline")).to_contain_text("Ray job")
    reward_chart = page.get_by_test_id("chart-0")
    expect(reward_chart).to_have_attribute("data-points", re.compile(r"^[1-9]\d*$"), timeout=20_000)
    expect(reward_chart.locator("canvas")).to_have_count(1)
    expect(page.get_by_test_id("log")).to_contain_text("step", timeout=20_000)
    # the log is searchable and downloadable
    page.get_by_test_id("log-search").fill("step 4:")
    expect(page.get_by_test_id("log-matches")).to_contain_text("step 4:")
    expect(page.get_by_test_id("log")).to_be_hidden()
    page.get_by_test_id("log-search").fill("")
    expect(page.get_by_test_id("log")).to_be_visible()
    with page.expect_download() as download:
        page.get_by_test_id("log-download").click()
    assert "step 4:" in Path(download.value.path()).read_text()
    expect(page.get_by_test_id("checkpoints")).to_contain_text("checkpoints/step_4", timeout=20_000)
    expect(page.get_by_test_id("mlflow-link")).to_have_attribute("href", re.compile(first.mlflow_run_id))
    # the source lists its clone
    expect(page.locator("section", has_text="Clones and restarts")).to_contain_text(f"#{second.pk}")
    screenshot(page, "run")

    page.goto(f"/runs/{second.pk}/")
    wait_for_state(page, "SUCCEEDED")

    page.goto("/runs/")
    expect(page.get_by_test_id(f"run-row-{second.pk}")).to_contain_text("Succeeded")
    expect(page.get_by_test_id(f"progress-{second.pk}")).to_contain_text("step 4 of 4 (100 %)")
    screenshot(page, "runs")
    page.get_by_label(f"Select run {first.pk} to compare").check()
    page.get_by_label(f"Select run {second.pk} to compare").check()
    page.get_by_role("button", name="Compare selected").click()
    expect(page).to_have_url(re.compile(r"/compare/\?runs="))
    chart = page.get_by_test_id("compare-chart-reward/mean")
    expect(chart).to_have_attribute("data-points", re.compile(r"^[1-9]\d*$"))
    expect(chart.locator(".u-legend")).to_contain_text("ui grpo (clone)")
    finals = page.get_by_test_id("final-metrics")
    reward_row = finals.locator("tr", has_text="reward/mean")
    expect(reward_row.locator("td")).to_have_count(3)
    expect(reward_row.locator("td").nth(1)).to_contain_text("(4)")  # the last of 4 steps
    diff = page.get_by_test_id("spec-diff")

    def row(path):
        return diff.locator("tr").filter(has=page.locator("td:first-child", has_text=re.compile(
            f"^{re.escape(path)}$")))

    expect(row("actor.lr")).to_be_visible()
    expect(row("actor.lr")).to_contain_text("0.002")
    expect(row("model.path")).to_be_hidden()  # the same in both
    page.get_by_label("Differences only").uncheck()
    expect(row("model.path")).to_be_visible()
    page.get_by_label("Differences only").check()
    expect(page.get_by_test_id("mlflow-compare")).to_have_attribute("href", re.compile("compare-runs"))
    screenshot(page, "compare")


def test_cancel_a_running_run_from_its_page(page, team, sign_in, worker, local_cluster):
    owner = team["users"]["owner"]
    run, _ = services.submit_run(team["experiment"], owner, services.Submission(
        spec=tiny_run(400, save_every=0), name="long"))
    sign_in(owner)
    page.goto(f"/runs/{run.pk}/")
    wait_for_state(page, "RUNNING", timeout=120_000)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("cancel").click()
    expect(page.locator(".messages")).to_contain_text("cancel requested")
    wait_for_state(page, "CANCELLED", timeout=120_000)
    expect(page.get_by_test_id("cancel")).to_have_count(0)
    expect(page.get_by_test_id("restart")).to_be_visible()
    expect(page.get_by_test_id("log")).to_have_attribute("data-ended", "true", timeout=20_000)
    # the job stops cleanly: its log ends with the reason, not with a shutdown traceback
    log = page.get_by_test_id("log").inner_text()
    assert "Traceback" not in log, log[-3000:]


def test_an_invalid_spec_shows_the_error_at_its_field_and_keeps_the_input(page, team, sign_in):
    sign_in(team["users"]["maintainer"])
    page.goto("/runs/new/")
    page.get_by_label("Run name").fill("keep me")
    field(page, "data.synthetic.task").select_option("addition")
    open_section(page, "actor")
    field(page, "actor.lr").fill("-1")
    open_section(page, "rollout")
    field(page, "rollout.temperature").fill("0.7")
    page.get_by_role("button", name="Submit run").click()
    expect(page.get_by_test_id("error-actor.lr")).to_contain_text("greater than 0")
    expect(page.get_by_label("Run name")).to_have_value("keep me")
    expect(field(page, "rollout.temperature")).to_have_value("0.7")
    expect(field(page, "actor.lr")).to_have_value("-1")
    screenshot(page, "submit-error")

    # Broken YAML: the error names the line, and the text stays as typed.
    page.get_by_role("tab", name="YAML").click()
    broken = "algorithm: grpo\nactor:\n  lr: [0.1\n"
    page.get_by_test_id("yaml").fill(broken)
    page.get_by_role("tab", name="Form").click()  # cannot convert: stays in YAML with the reason
    expect(page.get_by_test_id("spec-errors")).to_contain_text("YAML syntax error")
    expect(page.get_by_test_id("yaml")).to_have_value(broken)
    page.get_by_role("button", name="Submit run").click()
    expect(page.get_by_test_id("spec-errors")).to_contain_text("line")
    expect(page.get_by_test_id("yaml")).to_have_value(broken)
    assert Run.objects.count() == 0


def test_the_runs_list_follows_states_and_keeps_what_is_ticked(page, team, sign_in):
    owner = team["users"]["owner"]
    submission = services.Submission(spec=tiny_run(2), name="watched")
    first, _ = services.submit_run(team["experiment"], owner, submission)
    sign_in(owner)
    page.goto("/runs/?state=QUEUED&state=CANCELLED")
    expect(page.get_by_test_id(f"run-row-{first.pk}")).to_contain_text("Queued")
    page.get_by_label(f"Select run {first.pk} to compare").check()
    second, _ = services.submit_run(team["experiment"], owner, services.Submission(
        spec=tiny_run(2), name="later"))
    services.cancel_run(first, owner)
    expect(page.get_by_test_id(f"run-row-{first.pk}")).to_contain_text("Cancelled", timeout=15_000)
    expect(page.get_by_test_id(f"run-row-{second.pk}")).to_contain_text("Queued")
    expect(page.get_by_label(f"Select run {first.pk} to compare")).to_be_checked()


def test_a_viewer_sees_no_write_buttons(page, team, sign_in):
    owner = team["users"]["owner"]
    run, _ = services.submit_run(team["experiment"], owner, services.Submission(
        spec=tiny_run(2), name="seen by a viewer"))
    services.cancel_run(run, owner)
    sign_in(team["users"]["viewer"])
    page.goto("/runs/")
    expect(page.get_by_test_id(f"run-row-{run.pk}")).to_contain_text("Cancelled")
    expect(page.get_by_role("link", name="Submit a run")).to_have_count(0)
    expect(page.get_by_role("link", name="Submit", exact=True)).to_have_count(0)
    page.goto(f"/runs/{run.pk}/")
    expect(page.locator("#run-status")).to_have_attribute("data-state", "CANCELLED")
    for name in ("cancel", "clone", "restart"):
        expect(page.get_by_test_id(name)).to_have_count(0)
    page.goto("/runs/new/")
    expect(page.get_by_test_id("cannot-submit")).to_be_visible()
    expect(page.get_by_role("button", name="Submit run")).to_have_count(0)


def test_a_form_sent_again_from_the_back_button_queues_nothing_new(page, team, sign_in):
    sign_in(team["users"]["owner"])
    page.goto("/runs/new/")
    page.get_by_label("Run name").fill("only once")
    field(page, "data.synthetic.task").select_option("addition")
    page.get_by_role("button", name="Submit run").click()
    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
    run = Run.objects.get()
    page.go_back()
    expect(page.get_by_label("Run name")).to_have_value("only once")
    page.get_by_role("button", name="Submit run").click()
    expect(page).to_have_url(re.compile(rf"/runs/{run.pk}/$"))
    expect(page.locator(".messages")).to_contain_text(f"already submitted as run {run.pk}")
    # Changed and sent again, the stale form is refused with the way out; a fresh form works.
    page.go_back()
    page.get_by_label("Run name").fill("changed")
    page.get_by_role("button", name="Submit run").click()
    expect(page.get_by_test_id("spec-errors")).to_contain_text("Reload the page")
    expect(page.get_by_label("Run name")).to_have_value("changed")
    assert Run.objects.count() == 1
    page.goto("/runs/new/")
    page.get_by_label("Run name").fill("changed")
    field(page, "data.synthetic.task").select_option("addition")
    page.get_by_role("button", name="Submit run").click()
    expect(page.locator(".messages")).to_contain_text(re.compile(r"Run \d+ submitted\."))
    assert Run.objects.count() == 2
