"""The tools in a real browser, on runs the whole platform ran (this live server, a Celery worker,
a Ray head, an MLflow server): a run's page with where each stage's time went, the profiler's
traces, its precision dumps and the determinism report; the precision comparison of a run
against an identical one (no divergence) and against the same in bfloat16 (the first divergence
highlighted). The screenshots are docs/tools.md's."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from experiments import services
from tests.browser.conftest import screenshot
from tests.stack import tiny_run

RUN_TIMEOUT_MS = 240_000


def tools_run(dtype: str = "float32") -> dict:
    spec = tiny_run(3, save_every=0, deterministic=True)
    spec["model"]["dtype"] = dtype
    spec["tools"] = {"profiling": {"enable": True, "steps": [2], "stages": ["rollout", "update"]},
                     "precision": {"enable": True, "steps": [2]}}
    return spec


def wait_for(page, run) -> None:
    page.goto(f"/runs/{run.pk}/")
    expect(page.locator("#run-status")).to_have_attribute("data-state", "SUCCEEDED",
                                                          timeout=RUN_TIMEOUT_MS)


def test_the_tools_of_runs_and_their_precision_comparison(page, team, sign_in, worker,
                                                          local_cluster):
    owner = team["users"]["owner"]
    runs = [services.submit_run(team["experiment"], owner, services.Submission(
        spec=tools_run(dtype), name=name))[0]
        for name, dtype in (("reference", "float32"), ("same again", "float32"),
                            ("in bfloat16", "bfloat16"))]
    run = runs[0]
    sign_in(owner)
    for each in reversed(runs):
        wait_for(page, each)  # the reference last: its page stays
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
    expect(page.get_by_test_id("precision-dumps")).to_contain_text("of step 2 in MLflow")
    screenshot(page, "tools-run", page.locator("#run-tools").locator(".."))

    # The same spec again: no divergence, every stage compared.
    page.get_by_test_id("precision-compare-link").click()
    expect(page).to_have_url(re.compile(rf"/compare/precision/\?b={run.pk}$"))
    page.get_by_label("Reference run (A)").select_option(str(runs[1].pk))
    page.get_by_role("button", name="Compare").click()
    expect(page.get_by_test_id("precision-summary")).to_contain_text("no divergence")
    stages = page.get_by_test_id("precision-stages")
    for stage in ("rollout", "reward", "ref_logprob", "advantages", "update"):
        expect(stages.get_by_role("link", name=stage, exact=True).first).to_be_visible()
    expect(page.get_by_test_id("first-divergence")).to_have_count(0)

    # The same in bfloat16: the first divergence is shown, its row highlighted and in view,
    # the error curves drawn.
    page.get_by_label("Reference run (A)").select_option(str(run.pk))
    page.get_by_label("Run to check (B)").select_option(str(runs[2].pk))
    page.get_by_role("button", name="Compare").click()
    first = page.get_by_test_id("first-divergence")
    expect(first).to_be_visible()
    expect(page.get_by_test_id("precision-summary")).to_contain_text("first divergence: stage")
    row = page.get_by_test_id("first-divergence-row")
    expect(row).to_be_in_viewport()
    expect(row).to_contain_text("diverged")
    curves = page.get_by_test_id("precision-curves")
    expect(curves).to_have_attribute("data-points", re.compile(r"^[1-9]\d*$"))
    expect(curves.locator("canvas")).to_have_count(1)
    page.get_by_label("Diverged only").check()
    expect(page.get_by_test_id("precision-rows").locator("tr.same").first).to_be_hidden()
    screenshot(page, "tools-precision")

    # What the page says is the report's: the same first divergence from the command's function
    from experiments.precision import compare_runs

    for each in runs:
        each.refresh_from_db()
    report = compare_runs(run, runs[2])
    assert report["diverged"]
    expect(first).to_contain_text(report["first_divergence"]["tensor"])
    expect(first).to_contain_text(report["first_divergence"]["stage"])

    # ... and the API's, for pipelines: the same report as JSON
    answer = page.request.get(f"/api/v1/runs/{runs[2].pk}/precision/?against={run.pk}")
    assert answer.status == 200
    assert answer.json()["first_divergence"] == report["first_divergence"]
    same = page.request.get(f"/api/v1/runs/{runs[1].pk}/precision/?against={run.pk}").json()
    assert same["diverged"] is False and "no divergence" in same["summary"]
