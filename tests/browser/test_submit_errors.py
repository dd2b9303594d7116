"""Submit form errors in a real browser: a setting the API refuses (a cluster of another device
kind, a priority out of range) is shown at its field, with the API's message, and nothing is
stored."""

from __future__ import annotations

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
