"""The web UI on a 390 px phone and to assistive technology, in a real browser: no page scrolls
sideways (the navigation folds behind a Menu button, tables scroll inside their card, charts
fit); axe-core (from the npm registry, frontend/package.json) finds no serious or critical
violation on the main pages; charts have a text summary and a table view."""

from __future__ import annotations

import json
import re

import pytest
from django.conf import settings
from playwright.sync_api import expect

from tests.browser.conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)
PHONE = {"width": 390, "height": 844}
AXE = settings.NODE_MODULES / "axe-core" / "axe.min.js"
METRICS = {"reward/mean": [0.1, 0.3, 0.5, 0.625], "actor/entropy": [2.0, 1.8, 1.7, 1.5],
           "response_length/mean": [4.0, 4.0, 3.5, 3.0], "actor/kl_loss": [0.0, 0.01, 0.02, 0.03]}


@pytest.fixture
def pages(team, logged):
    """The main pages of a signed-in owner, with a run that has metrics."""
    run = logged("charted run", METRICS)
    return {"dashboard": "/", "runs": "/runs/", "run": f"/runs/{run.pk}/", "submit": "/runs/new/",
            "settings": "/settings/", "clusters": "/clusters/", "compare": f"/compare/?runs={run.pk}"}


def overflow(page) -> int:
    """How far the page is wider than the viewport (0: no sideways scrolling)."""
    return page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")


def test_no_page_scrolls_sideways_on_a_phone(page, team, sign_in, pages):
    page.set_viewport_size(PHONE)
    sign_in(team["users"]["owner"])
    for name, url in pages.items():
        page.goto(url)
        if name == "run":
            expect(page.locator("#charts")).to_have_attribute("data-loaded", "true", timeout=20_000)
        assert overflow(page) == 0, f"{name} ({url}) is {overflow(page)} px wider than the phone"
    page.goto(pages["run"])
    expect(page.locator("#charts")).to_have_attribute("data-loaded", "true", timeout=20_000)
    chart = page.get_by_test_id("chart-0").locator("canvas")
    assert chart.bounding_box()["x"] + chart.bounding_box()["width"] <= PHONE["width"]
    screenshot(page, "phone-run")

    # the navigation folds behind the Menu button
    nav = page.get_by_role("navigation", name="Main")
    expect(nav).to_be_hidden()
    page.get_by_test_id("menu").click()
    expect(page.get_by_test_id("menu")).to_have_attribute("aria-expanded", "true")
    expect(nav.get_by_role("link", name="Runs")).to_be_visible()
    screenshot(page, "phone-menu")
    nav.get_by_role("link", name="Runs").click()
    expect(page).to_have_url(f"{page.url.split('/runs/')[0]}/runs/")


def axe_violations(page) -> list[dict]:
    """axe-core's serious and critical violations of the page as it is now."""
    page.evaluate(AXE.read_text())  # evaluated by the browser's debugger: no CSP exception needed
    result = page.evaluate("""async () => (await axe.run(document, {
        runOnly: {type: "tag", values: ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "best-practice"]},
    })).violations.filter(v => ["serious", "critical"].includes(v.impact)).map(v => ({
        id: v.id, impact: v.impact, help: v.help,
        nodes: v.nodes.slice(0, 3).map(n => n.target.join(" "))}))""")
    return result


def test_axe_finds_no_serious_violation_on_the_main_pages(page, team, sign_in, pages):
    assert AXE.is_file(), f"{AXE} is missing: run `make install` (npm ci in frontend/)"
    sign_in(team["users"]["owner"])
    found = {}
    for name, url in pages.items():
        page.goto(url)
        if name == "run":
            expect(page.locator("#charts")).to_have_attribute("data-loaded", "true", timeout=20_000)
        violations = axe_violations(page)
        if violations:
            found[name] = violations
    assert found == {}, json.dumps(found, indent=1)


def test_charts_have_a_text_summary_and_a_table_view(page, team, sign_in, pages):
    sign_in(team["users"]["owner"])
    page.goto(pages["run"])
    chart = page.get_by_test_id("chart-0")
    summary = chart.get_by_test_id("chart-summary")
    expect(summary).to_have_text("reward/mean: last 0.625 at step 4, min 0.1, max 0.625 (4 steps)",
                                 timeout=20_000)
    expect(chart.get_by_role("img")).to_have_accessible_name("Reward chart: " + summary.inner_text())
    chart.get_by_text("Table view").click()
    table = chart.locator("[data-chart-table] table")  # (uPlot's legend is a table too)
    expect(table.locator("tbody tr")).to_have_count(4)
    expect(table.locator("tbody tr").last).to_contain_text("4")
    expect(table.locator("tbody tr").last).to_contain_text("0.625")
    # focus and selection look different on the algorithm presets: the selected card is filled,
    # the focused one (from the keyboard) carries a ring of another colour besides
    page.goto(pages["submit"])
    expect(page.get_by_role("radio", name=re.compile("^GRPO"))).to_be_checked()
    look = """() => [...document.querySelectorAll('.presets label')].map(l => {
        const s = getComputedStyle(l);
        return {checked: l.querySelector('input').checked, outline: s.outlineStyle,
                ring: s.outlineColor, border: s.borderTopColor, fill: s.backgroundColor};
    })"""
    unfocused = page.evaluate(look)
    page.get_by_label("Run name").focus()
    page.keyboard.press("Shift+Tab")  # back into the radio group: onto the checked preset
    focused = page.evaluate(look)
    chosen = [c for c in focused if c["checked"]][0]
    assert chosen["outline"] != "none" and chosen["ring"] != chosen["border"], chosen
    assert all(c["outline"] == "none" for c in unfocused), unfocused
    assert all(c["fill"] != chosen["fill"] for c in unfocused if not c["checked"]), unfocused
