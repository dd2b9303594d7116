"""The two model families from the web UI, on the whole platform (this live server, a Celery
worker process, a Ray head with 2 CPUs and an MLflow server): the submit page's "Start from"
links fill the form for a mixture of experts and for a vision-language model; a mixture of
experts trains with its experts split over the head's two CPUs, and a vision-language run trains
on the counting pictures, its sample viewer showing each sample's picture as the model saw it."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from experiments.models import Run
from experiments.tracking import run_metrics
from tests.browser.conftest import screenshot
from tests.browser.test_runs import field, open_section, wait_for_state

pytestmark = pytest.mark.django_db(transaction=True)
# Each run: the Ray job's start, the model (tiny:vl-squares: a short SFT, made on first use) and
# two steps.
RUN_TIMEOUT_MS = 300_000


def submit(page, name: str) -> Run:
    page.get_by_label("Run name").fill(name)
    page.get_by_role("button", name="Submit run").click()
    expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
    return Run.objects.get(name=name)


def test_a_mixture_of_experts_and_a_vision_language_model_train_from_the_web_ui(
        page, team, sign_in, worker, local_cluster):
    sign_in(team["users"]["owner"])
    page.goto("/runs/new/")
    expect(page.get_by_test_id("starter-text")).to_have_attribute("aria-current", "true")

    # a mixture of experts: its starter, its experts split over two devices
    page.get_by_test_id("starter-moe").click()
    expect(field(page, "model.path")).to_have_value("tiny:moe-addition")
    expect(field(page, "actor.router_aux_loss_coef")).to_have_value("0.001")
    # the raw tiny:moe-nano (4 experts): the starter's warm start is an SFT of several minutes
    field(page, "model.path").fill("tiny:moe-nano")
    field(page, "trainer.total_steps").fill("2")
    open_section(page, "actor")
    field(page, "actor.strategy").select_option("fsdp2")
    open_section(page, "parallel")
    field(page, "parallel.expert_parallel_size").fill("2")
    open_section(page, "resources")
    field(page, "resources.devices_per_node").fill("2")
    moe = submit(page, "experts")
    assert moe.spec["parallel"]["expert_parallel_size"] == 2
    wait_for_state(page, "SUCCEEDED", timeout=RUN_TIMEOUT_MS)
    moe.refresh_from_db()
    latest = run_metrics(moe, [])["latest"]
    assert latest["actor/moe/aux_loss"] > 0 and latest["actor/moe/load_max"] >= 1, latest

    # a vision-language model: its starter as it is, for two steps
    page.goto("/runs/new/")
    page.get_by_test_id("starter-vision").click()
    expect(page.get_by_test_id("starter-vision")).to_have_attribute("aria-current", "true")
    expect(field(page, "model.path")).to_have_value("tiny:vl-squares")
    expect(field(page, "data.synthetic.task")).to_have_value("squares")
    field(page, "trainer.total_steps").fill("2")
    vision = submit(page, "pictures")
    wait_for_state(page, "SUCCEEDED", timeout=RUN_TIMEOUT_MS)
    vision.refresh_from_db()
    history = run_metrics(vision, ["val/accuracy", "reward/mean"])["history"]
    assert len(history["reward/mean"]) == 2 and history["val/accuracy"], history

    # the sample viewer: each sampled prompt's picture (56 x 56 pixels: the 2 x 2 board of the
    # counting task), served from MLflow
    samples = page.get_by_test_id("samples")
    # the viewer polls while the run is active and is swapped once more as it ends: wait for
    # that last swap, so the pictures below stay in the page
    expect(page.locator("#run-samples[hx-get]")).to_have_count(0, timeout=20_000)
    expect(samples.locator("caption")).to_have_text("Samples of step 1", timeout=20_000)
    pictures = samples.get_by_test_id("sample-picture")
    expect(pictures).to_have_count(4)
    expect(samples.locator("thead th").last).to_have_text("images")
    first = pictures.first
    first.scroll_into_view_if_needed()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0",
                           arg=first.element_handle())
    assert first.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [56, 56]
    screenshot(page, "run-samples-pictures", page.locator("section.card").filter(
        has=page.get_by_role("heading", name="Samples", exact=True)))
    # a path that names no sample picture is refused, an absent one is not found
    url = f"/runs/{vision.pk}/samples/picture"
    assert page.request.get(f"{url}?path=../../etc/passwd").status == 404
    assert page.request.get(f"{url}?path=samples/step_99/0_0.png").status == 404
