"""The memory plan on the submit page: a 7B spec on a 64 GB NPU cluster does not fit and names
fsdp2, "submit anyway" sends it regardless, and a tiny spec fits."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from clusters.models import Cluster, Node
from experiments.models import Run
from tests.browser.conftest import screenshot

BIG_YAML = """\
algorithm: grpo
name: big
model: {path: /models/Qwen2.5-7B-Instruct, dtype: bfloat16}
actor: {strategy: torch}
resources: {device_type: npu, devices_per_node: 8}
data:
  synthetic: {task: addition}
  train_batch_size: 16
rollout: {n_samples_per_prompt: 8}
"""
TINY_YAML = """\
algorithm: grpo
model: {path: "tiny:nano"}
resources: {device_type: npu}
data:
  synthetic: {task: addition}
"""


@pytest.fixture
def npu_cluster(team) -> Cluster:
    cluster = Cluster.objects.create(name="ascend-64", device_type="npu",
                                     ray_address="http://ascend:8265")
    Node.objects.create(cluster=cluster, hostname="a1", device_type="ascend-910b", device_count=8,
                        healthy_device_count=8, cpu_count=192)
    return cluster


def dry_run(page, yaml_text: str) -> None:
    page.get_by_role("tab", name="YAML").click()
    page.get_by_test_id("yaml").fill(yaml_text)
    page.get_by_role("button", name="Dry run").click()


def test_a_7b_spec_does_not_fit_a_64_gb_npu_and_may_be_sent_anyway(page, team, sign_in,
                                                                   npu_cluster):
    sign_in(team["users"]["owner"])
    page.goto("/runs/new/")
    page.locator('select[name="cluster"]').select_option(label="ascend-64 (npu)")
    dry_run(page, BIG_YAML)
    verdict = page.get_by_test_id("memory-verdict")
    expect(verdict).to_contain_text("does not fit")
    expect(verdict).to_contain_text("64.0 GiB per NPU")
    expect(verdict).to_contain_text("with actor.strategy=fsdp2 it needs")
    plan = page.get_by_test_id("memory-plan")
    expect(plan.locator("tr", has_text="actor")).to_have_count(1)
    expect(plan).to_contain_text("ascend-910b on ascend-64")
    screenshot(page, "submit-memory-plan")

    # Without "submit anyway" the run is refused with the same verdict.
    page.get_by_role("button", name="Submit run").click()
    expect(page.get_by_test_id("memory-verdict")).to_contain_text("does not fit")
    expect(page.locator("body")).to_contain_text("set ignore_memory_plan to submit anyway")
    assert Run.objects.count() == 0

    page.get_by_label("Submit anyway").check()
    page.get_by_role("button", name="Submit run").click()
    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
    assert Run.objects.get().cluster == npu_cluster


def test_a_tiny_spec_fits(page, team, sign_in, npu_cluster):
    sign_in(team["users"]["owner"])
    page.goto("/runs/new/")
    dry_run(page, TINY_YAML)
    expect(page.get_by_test_id("memory-verdict")).to_contain_text(re.compile(r"^fits: "))
    expect(page.get_by_test_id("ignore-memory-plan")).to_have_count(0)
