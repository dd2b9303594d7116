"""The tools on a run's page in a real browser: where each stage's time went, the profiler's
traces in MLflow and the determinism report, for a run the whole platform ran (this live
server, a Celery worker, a Ray head, an MLflow server). The screenshots are docs/tools.md's."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from experiments import services
from tests.browser.conftest import screenshot
from tests.stack import tiny_run

RUN_TIMEOUT_MS = 240_000


def tools_run(steps: int = 3, **tools) -> dict:
    spec = tiny_run(steps, save_every=0, deterministic=True)
    spec["tools"] = tools
    return spec


def test_stage_times_traces_and_determinism_on_the_run_page(page, team, sign_in, worker,
                                                             local_cluster):
    owner = team["users"]["owner"]
    run, _ = services.submit_run(team["experiment"], owner, services.Submission(
        spec=tools_run(profiling={"enable": True, "steps": [2], "stages": ["rollout", "update"]}),
        name="profiled"))
    sign_in(owner)
    page.goto(f"/runs/{run.pk}/")
    expect(page.locator("#run-status")).to_have_attribute("data-state", "SUCCEEDED",
                                                          timeout=RUN_TIMEOUT_MS)
    page.reload()  # the tools card as it is at the end
    stages = page.get_by_test_id("stage-breakdown")
    expect(stages.locator("tr[data-stage=update]")).to_be_visible(timeout=20_000)
    expect(stages.locator("tr[data-stage=rollout] meter")).to_have_attribute(
        "aria-label", re.compile(r"^rollout: \d+% of a step$"))
    traces = page.get_by_test_id("profile-traces")
    expect(traces.locator("tbody tr")).to_have_count(2)  # step 2, rank 0: rollout and update
    expect(traces).to_contain_text("actor-rank0-update.json")
    expect(traces.get_by_role("link").first).to_have_attribute(
        "href", re.compile(r"/artifacts/profiles/step_2/actor-rank0-"))
    summary = page.get_by_test_id("determinism-summary")
    expect(summary).to_contain_text("Deterministic run: seed 3")
    expect(summary).to_contain_text("every process is in the run's mode")
    page.get_by_text("What each process set").click()
    expect(page.get_by_test_id("determinism-processes")).to_contain_text("HCCL_DETERMINISTIC=true")
    screenshot(page, "tools-run", page.locator("#run-tools").locator(".."))
