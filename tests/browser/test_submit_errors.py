"""Submit form errors in a real browser: a setting the API refuses (a cluster of another device
kind, a priority out of range) is shown at its field, with the API's message, and nothing is
stored; what can be known before the job starts (a synthetic task too small for its sizes) is
refused at submit; every error comes in one answer, tied to its input; the dry run's result
is in view."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from clusters.models import Cluster
from experiments.limits import PRIORITY
from experiments.models import Run
from tests.browser.test_runs import field, open_section


def fill_a_valid_spec(page) -> None:
    page.goto("/runs/new/")
    page.get_by_label("Run name").fill("pinned")
    field(page, "data.synthetic.task").select_option("addition")


def test_a_cluster_of_another_device_kind_is_shown_at_the_cluster_field(page, team, sign_in):
    cluster = Cluster.objects.create(name="npu-a", device_type="npu", ray_address="http://head:8265")
    sign_in(team["users"]["maintainer"])
    fill_a_valid_spec(page)
    open_section(page, "resources")
    field(page, "resources.device_type").select_option("gpu")
    page.get_by_label("Cluster").select_option(str(cluster.pk))
    page.get_by_role("button", name="Submit run").click()
    expect(page.get_by_test_id("error-cluster")).to_contain_text(
        "Cluster npu-a provides npu devices but the spec asks for gpu")
    expect(page.get_by_label("Cluster")).to_have_value(str(cluster.pk))
    expect(page.get_by_label("Run name")).to_have_value("pinned")
    assert Run.objects.count() == 0


def test_a_priority_out_of_range_is_shown_at_its_field(page, team, sign_in):
    sign_in(team["users"]["owner"])
    fill_a_valid_spec(page)
    priority = page.get_by_label("Priority")
    expect(priority).to_have_attribute("max", str(PRIORITY.high))
    priority.fill(str(PRIORITY.high + 1))
    page.get_by_role("button", name="Submit run").click()
    expect(page.get_by_test_id("error-priority")).to_have_text(PRIORITY.message)
    expect(page.get_by_label("Priority")).to_have_value(str(PRIORITY.high + 1))
    assert Run.objects.count() == 0


def test_a_synthetic_task_too_small_for_its_sizes_is_refused_by_the_dry_run(page, team, sign_in):
    sign_in(team["users"]["owner"])
    page.goto("/runs/new/")
    field(page, "data.synthetic.digits").fill("1")  # 100 problems, the starter asks for 4,200
    page.get_by_role("button", name="Dry run").click()
    error = page.get_by_test_id("error-data.synthetic.num_train")
    expect(error).to_contain_text("only 100 distinct 1-digit addition problems exist")
    expect(page.get_by_test_id("dry-run")).to_have_count(0)
    expect(error).to_be_in_viewport()
    assert Run.objects.count() == 0


def test_every_error_of_the_form_comes_in_one_answer(page, team, sign_in):
    sign_in(team["users"]["owner"])
    page.goto("/runs/new/")
    field(page, "actor.lr").fill("fast")           # does not parse
    field(page, "rollout.temperature").fill("-1")  # parses, out of range
    field(page, "data.synthetic.digits").fill("1")  # parses, too few problems
    page.get_by_role("button", name="Submit run").click()
    expect(page.get_by_test_id("error-actor.lr")).to_contain_text("Enter a number")
    expect(page.get_by_test_id("error-rollout.temperature")).to_be_visible()
    expect(page.get_by_test_id("error-data.synthetic.num_train")).to_contain_text("only 100")
    # each error is tied to its input, which says it is invalid; labels are the visible names
    lr = field(page, "actor.lr")
    expect(lr).to_have_attribute("aria-invalid", "true")
    expect(lr).to_have_accessible_description(re.compile("^Enter a number"))
    expect(page.get_by_label("Total steps", exact=True)).to_have_value("60")
    assert Run.objects.count() == 0


def test_the_dry_run_result_is_in_view(page, team, sign_in):
    sign_in(team["users"]["owner"])
    page.goto("/runs/new/")
    page.get_by_role("button", name="Dry run").click()
    expect(page.get_by_test_id("dry-run")).to_contain_text("Dry run: the spec is valid")
    expect(page.get_by_test_id("dry-run")).to_be_in_viewport()
    assert Run.objects.count() == 0
