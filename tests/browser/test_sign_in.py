"""Signing in and out, and what a signed-out visitor or a stranger sees."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from experiments.models import Run
from tests.browser.conftest import screenshot


def test_sign_in_with_the_form_then_out(page, team):
    page.goto("/runs/")
    expect(page).to_have_url(re.compile(r"/sign-in/\?next=/runs/"))
    page.get_by_label("Username").fill("owner")
    page.get_by_label("Password").fill("wrong password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("enter a correct username and password")
    expect(page.get_by_label("Username")).to_have_value("owner")
    screenshot(page, "sign-in")

    page.get_by_label("Password").fill("owner-pass-123")
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/runs/$"))
    expect(page.get_by_test_id("username")).to_have_text("owner")

    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/sign-in/"))


def test_a_run_of_another_project_is_a_404_page(page, team, sign_in, console):
    run = Run.objects.create(experiment=team["experiment"], spec={}, algorithm="grpo",
                             device_type="cpu", device_count=1, created_by=team["users"]["owner"])
    sign_in(team["users"]["stranger"])
    console.expect(r"status of 404")  # the browser reports the page's own status
    response = page.goto(f"/runs/{run.pk}/")
    assert response.status == 404
    expect(page.get_by_test_id("not-found")).to_contain_text(f"Run {run.pk} does not exist")
    expect(page.locator("body")).not_to_contain_text("Traceback")
    screenshot(page, "not-found")


def test_too_many_failed_sign_ins_lock_the_form(page, team, console):
    console.expect(r"status of 429")  # the browser reports the locked page's status
    page.goto("/sign-in/")
    for _ in range(10):
        page.get_by_label("Username").fill("owner")
        page.get_by_label("Password").fill("wrong password")
        page.get_by_role("button", name="Sign in").click()
    page.get_by_label("Password").fill("owner-pass-123")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_test_id("locked-out")).to_contain_text(
        "Too many failed sign-ins; try again in 15 minutes")
    expect(page).to_have_url(re.compile(r"/sign-in/$"))
    expect(page.get_by_test_id("username")).to_have_count(0)  # not signed in
