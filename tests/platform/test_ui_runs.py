"""The web UI's run pages through Django's test client: list, submit, detail, cancel, restart."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from experiments import services
from experiments.choices import RunState
from experiments.models import Run
from frontend import specform

pytestmark = pytest.mark.django_db


def form(experiment, **fields):
    data = {"experiment": experiment.pk, "key": "k1", "mode": "form", "algorithm": "grpo",
            "spec.data.synthetic.task": "addition", "action": "submit"}
    data.update(fields)
    return data


def make_run(experiment, user, state=RunState.QUEUED, algorithm="grpo", **fields) -> Run:
    spec = {"algorithm": algorithm, "data": {"synthetic": {"task": "addition"}}}
    return Run.objects.create(experiment=experiment, spec=spec, algorithm=algorithm,
                              device_type="cpu", device_count=1, created_by=user, state=state,
                              **fields)


def test_pages_need_a_session(client, experiment):
    for url in ("/runs/", "/runs/new/", "/compare/"):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/sign-in/?next=")


def test_the_list_filters_searches_and_hides_other_projects(signed_in, experiment, users):
    mine = make_run(experiment, users["owner"], name="lr sweep a")
    make_run(experiment, users["maintainer"], state=RunState.FAILED, name="other")
    client = signed_in("viewer")
    page = client.get("/runs/").content.decode()
    assert f"/runs/{mine.pk}/" in page and "other" in page
    page = client.get("/runs/?state=FAILED").content.decode()
    assert "other" in page and "lr sweep a" not in page
    running = make_run(experiment, users["owner"], state=RunState.RUNNING, name="busy")
    page = client.get("/runs/?state=active").content.decode()
    assert "busy" in page and "other" not in page and "lr sweep a" not in page
    assert re.search(r'<option value="[A-Z,]+" selected>Active', page)
    page = client.get("/runs/?state=FAILED,RUNNING&state=bogus").content.decode()
    assert "busy" in page and "other" in page and "lr sweep a" not in page
    assert '<option value="FAILED,RUNNING" selected>failed,running</option>' in page
    assert "No state is called “bogus”: filtered by the others" in page
    page = client.get("/runs/?state=failed").content.decode()  # any case
    assert "other" in page and "busy" not in page and "state-notice" not in page
    page = client.get("/runs/?state=Nonsense").content.decode()  # said, not silently ignored
    assert "No state is called “Nonsense”: the state filter is off" in page
    running.delete()
    page = client.get("/runs/?q=sweep&creator=owner&algorithm=grpo").content.decode()
    assert "lr sweep a" in page and "other" not in page
    partial = client.get("/runs/?q=nothing-matches", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial and "No run matches these filters" in partial
    assert "No runs yet" in signed_in("stranger").get("/runs/").content.decode()


def test_submit_from_the_form_stores_only_what_was_filled(signed_in, experiment):
    client = signed_in("maintainer")
    response = client.post("/runs/new/", form(experiment, **{"spec.actor.lr": "3e-4",
                                                             "spec.trainer.total_steps": "5",
                                                             "run_name": "from the form"}))
    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert run.name == "from the form" and run.spec["actor"]["lr"] == 3e-4
    assert run.spec["trainer"]["total_steps"] == 5 and run.created_by.username == "maintainer"
    page = client.get(response["Location"]).content.decode()
    assert f"Run {run.pk} submitted." in page and "queued for" not in page  # no stale claim
    assert run.preemptible  # the box "Never preempt" left empty


def test_never_preempt_on_the_form_and_its_clone(signed_in, experiment):
    client = signed_in("maintainer")
    client.post("/runs/new/", form(experiment, not_preemptible="1"))
    run = Run.objects.get()
    assert not run.preemptible
    clone_form = client.get(f"/runs/new/?clone={run.pk}").content.decode()
    assert 'name="not_preemptible" value="1" checked' in clone_form


def test_a_stale_form_submitted_again_queues_nothing_new(signed_in, experiment):
    client = signed_in("owner")
    first = client.post("/runs/new/", form(experiment))
    again = client.post("/runs/new/", form(experiment), follow=True)
    assert Run.objects.count() == 1 and first["Location"] == f"/runs/{Run.objects.get().pk}/"
    assert "already submitted as run" in again.content.decode()
    changed = client.post("/runs/new/", form(experiment, **{"spec.actor.lr": "0.1"}))
    assert changed.status_code == 200 and Run.objects.count() == 1
    assert "Reload the page" in changed.content.decode()


def test_an_invalid_value_is_shown_at_its_field_and_every_input_is_kept(signed_in, experiment):
    client = signed_in("owner")
    response = client.post("/runs/new/", form(experiment, **{
        "spec.actor.lr": "-1", "spec.rollout.temperature": "warm", "run_name": "keep me"}))
    page = response.content.decode()
    assert response.status_code == 200 and Run.objects.count() == 0
    assert 'data-testid="error-rollout.temperature"' in page and "Enter a number" in page
    assert 'value="-1"' in page and 'value="warm"' in page and 'value="keep me"' in page
    # once the form parses, the spec's own rules speak at the field
    response = client.post("/runs/new/", form(experiment, **{"spec.actor.lr": "-1"}))
    page = response.content.decode()
    assert response.status_code == 200
    assert re.search(r'data-testid="error-actor.lr">[^<]*greater than 0', page), page[:3000]


def test_yaml_errors_stay_with_the_yaml(signed_in, experiment):
    client = signed_in("owner")
    bad = "algorithm: grpo\nactor:\n  lr: [1\n"
    response = client.post("/runs/new/", {"experiment": experiment.pk, "key": "k2", "mode": "yaml",
                                          "yaml": bad, "action": "submit"})
    page = response.content.decode()
    assert response.status_code == 200 and "YAML syntax error" in page and "lr: [1" in page
    unknown = "algorithm: grpo\ndata: {synthetic: {task: addition}}\nactor: {lrr: 1}\n"
    page = client.post("/runs/new/", {"experiment": experiment.pk, "key": "k2", "mode": "yaml",
                                      "yaml": unknown, "action": "submit"}).content.decode()
    assert "actor.lrr" in page and "lr" in page and Run.objects.count() == 0


def test_the_dry_run_shows_the_device_request_and_stores_nothing(signed_in, experiment, cluster):
    client = signed_in("owner")
    response = client.post("/runs/new/", form(experiment, action="dry_run", **{
        "spec.resources.device_type": "npu", "spec.resources.devices_per_node": "2"}))
    page = response.content.decode()
    assert response.status_code == 200 and Run.objects.count() == 0
    assert re.search(r"Device request: <strong>2 × npu</strong>", page)
    assert "npu-a" in page


def test_form_and_yaml_convert_both_ways(signed_in, experiment):
    client = signed_in("owner")
    to_yaml = client.post("/runs/new/convert/?to=yaml", form(experiment, **{"spec.actor.lr": "0.002"}))
    page = to_yaml.content.decode()
    assert 'name="mode" value="yaml"' in page and "lr: 0.002" in page
    text = "algorithm: dapo\nactor:\n  lr: 0.003\ndata:\n  synthetic:\n    task: addition\n"
    page = client.post("/runs/new/convert/?to=form", {"mode": "yaml", "yaml": text}).content.decode()
    assert 'name="mode" value="form"' in page and 'value="0.003"' in page
    assert re.search(r'value="dapo" checked', page)


def test_clone_prefills_what_differs_from_the_preset(signed_in, experiment, users):
    spec = specform.flatten({"algorithm": "dapo", "actor": {"lr": 0.01}})
    assert spec == {"algorithm": "dapo", "actor.lr": 0.01}
    source = make_run(experiment, users["owner"], name="base")
    source.spec = {**source.spec, "algorithm": "dapo", "actor": {"lr": 0.01, "weight_decay": 0.01}}
    source.save()
    page = signed_in("owner").get(f"/runs/new/?clone={source.pk}").content.decode()
    assert 'value="0.01"' in page and 'value="base (clone)"' in page
    assert re.search(r'value="dapo" checked', page)


def test_detail_page_shows_the_run_and_hides_it_from_strangers(signed_in, experiment, users):
    run = make_run(experiment, users["owner"], state=RunState.FAILED, error="boom")
    page = signed_in("viewer").get(f"/runs/{run.pk}/").content.decode()
    assert "boom" in page and 'data-testid="timeline"' in page
    # absolute times say their zone (settings.TIME_ZONE), in text and machine-readable
    zone = timezone.localtime(run.created_at).strftime("%Z")
    assert f'{timezone.localtime(run.created_at):%Y-%m-%d %H:%M:%S} {zone}</time>' in page
    assert f'datetime="{timezone.localtime(run.created_at).isoformat()}"' in page
    assert 'data-testid="cancel"' not in page and 'data-testid="restart"' not in page
    assert 'data-testid="clone"' not in page
    response = signed_in("stranger").get(f"/runs/{run.pk}/")
    assert response.status_code == 404 and "does not exist" in response.content.decode()
    assert signed_in("stranger").get(f"/runs/{run.pk}/status/").status_code == 404


def test_the_charts_follow_the_algorithm(signed_in, experiment, users):
    grpo = make_run(experiment, users["owner"])
    ppo = make_run(experiment, users["owner"], algorithm="ppo")
    ppo.spec = {**ppo.spec, "algorithm": "ppo", "critic": {"enable": True}}
    ppo.save()
    dpo = make_run(experiment, users["owner"], algorithm="dpo")
    client = signed_in("viewer")

    def titles(run):
        return re.findall(r'<div class="chart" data-keys="[^"]*" data-testid="[^"]*">\s*<h3>([^<]+)</h3>',
                          client.get(f"/runs/{run.pk}/").content.decode())

    assert titles(grpo)[:4] == ["Reward", "KL", "Entropy", "Response length"]
    assert "Critic value loss" in titles(ppo) and "Critic value loss" not in titles(grpo)
    assert titles(dpo)[:2] == ["DPO loss", "Preference accuracy"] and "KL" not in titles(dpo)
    assert "Stage timings (s)" in titles(dpo)


def test_cancel_and_restart_from_the_page(signed_in, experiment, users):
    run = make_run(experiment, users["owner"])
    client = signed_in("maintainer")
    assert client.post(f"/runs/{run.pk}/cancel/").status_code == 302
    run.refresh_from_db()
    assert run.state == RunState.CANCELLED
    response = client.post(f"/runs/{run.pk}/restart/")
    restart = Run.objects.exclude(pk=run.pk).get()
    assert response["Location"] == f"/runs/{restart.pk}/"
    assert restart.resume_from == run and restart.cloned_from == run
    again = client.post(f"/runs/{run.pk}/restart/", follow=True).content.decode()
    assert "already continues" in again and Run.objects.count() == 2
    viewer = signed_in("viewer")
    viewer.post(f"/runs/{restart.pk}/cancel/")
    restart.refresh_from_db()
    assert restart.state == RunState.QUEUED


def test_unknown_addresses_are_404s_in_the_shape_of_their_side(client, users, settings):
    settings.DEBUG = False
    client.force_login(users["owner"])
    page = client.get("/no-such-page/")
    assert page.status_code == 404 and "Nothing here at /no-such-page/" in page.content.decode()
    api = client.get("/api/v1/no-such-endpoint/")
    assert api.status_code == 404 and api.json()["error"] == "not_found"


def test_progress_counts_steps_and_estimates_the_time_left(signed_in, experiment, users):
    from datetime import timedelta

    from experiments.models import planned_steps

    assert planned_steps({"trainer": {"total_steps": 60}}) == 60
    # epochs of a synthetic task: full batches only
    assert planned_steps({"trainer": {"total_epochs": 2},
                          "data": {"synthetic": {"num_train": 100}, "train_batch_size": 16}}) == 12
    assert planned_steps({"trainer": {"total_epochs": 1}, "data": {"train_files": ["a.jsonl"]}}) is None
    run = make_run(experiment, users["owner"], state=RunState.RUNNING, name="halfway",
                   planned_steps=60)
    assert run.progress is None
    start = timezone.now()
    run.record_progress(5, start)  # the first step seen sets the pace's origin
    run.record_progress(35, start + timedelta(seconds=60))  # 30 steps a minute
    run.record_progress(20, start + timedelta(seconds=70))  # an older line (a restart): ignored
    run.refresh_from_db()
    assert run.progress == {"step": 35, "total": 60, "percent": pytest.approx(58.33, abs=0.01),
                            "eta_s": pytest.approx(50.0)}
    html = signed_in("owner").get("/runs/").content.decode()
    cell = html.split(f'data-testid="progress-{run.pk}"')[1].split("</span></td>")[0]
    assert "step 35 of 60 (58 %)" in cell and "about 50 s left" in cell
    page = signed_in("owner").get(f"/runs/{run.pk}/").content.decode()
    assert "step 35 of 60 (58 %)" in page
    # an automatic restart (a new attempt): the pace is measured again from the first step
    # beyond the last one seen, not across the minutes the restart took
    run.measure_pace_again()
    run.record_progress(30, start + timedelta(seconds=600))  # resumed from a checkpoint: old steps
    run.record_progress(36, start + timedelta(seconds=660))  # the first new one
    run.record_progress(46, start + timedelta(seconds=680))  # 10 steps in 20 s
    run.refresh_from_db()
    assert run.progress["step"] == 46 and run.progress["eta_s"] == pytest.approx(28.0)
    run.state = RunState.SUCCEEDED
    assert run.progress["eta_s"] is None  # nothing left to wait for


def test_the_log_downloads_as_one_text_file_with_every_attempt(signed_in, experiment, users, cluster):
    from experiments.models import Attempt, LogChunk

    run = make_run(experiment, users["owner"], state=RunState.RUNNING, name="logged")
    client = signed_in("viewer")
    before = client.get(f"/runs/{run.pk}/log.txt")
    assert b"".join(before.streaming_content).decode() == f"Run {run.pk} has not started: no log yet.\n"
    for number, texts in ((1, ["step 1: a\n", "killed\n"]), (2, ["resumed from step_1\n"])):
        attempt = Attempt.objects.create(run=run, number=number, cluster=cluster, device_count=1,
                                         ray_submission_id=Attempt.submission_id(run.pk, number))
        offset = 0
        for text in texts:
            LogChunk.objects.create(attempt=attempt, offset=offset, text=text)
            offset += len(text)
    response = client.get(f"/runs/{run.pk}/log.txt")
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}.log"'
    text = b"".join(response.streaming_content).decode()
    first, second = text.split("──── run")[1:]
    assert first.startswith(f" {run.pk}, attempt 1 on {cluster.name}") and "step 1: a\nkilled\n" in first
    assert second.startswith(f" {run.pk}, attempt 2") and "resumed from step_1" in second
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert f'href="/runs/{run.pk}/log.txt" download' in page and 'id="log-search"' in page
    assert signed_in("stranger").get(f"/runs/{run.pk}/log.txt").status_code == 404


def _order(page: str) -> list[str]:
    """The run names in the order the runs table lists them."""
    return re.findall(r'<a href="/runs/\d+/">#\d+ ([^<]+)</a>', page)


def test_the_column_headers_sort_the_list_and_say_how(signed_in, experiment, users):
    now, minutes = timezone.now(), timezone.timedelta(minutes=1)
    for name, state, devices, started, finished in (
            ("b-short", RunState.SUCCEEDED, 2, now - 5 * minutes, now - 4 * minutes),
            ("a-long", RunState.FAILED, 8, now - 30 * minutes, now),
            ("c-running", RunState.RUNNING, 1, now, None)):
        run = make_run(experiment, users["owner"], name=name, state=state, started_at=started,
                       finished_at=finished)
        Run.objects.filter(pk=run.pk).update(device_count=devices)
    client = signed_in("viewer")

    page = client.get("/runs/?sort=run").content.decode()
    assert _order(page) == ["a-long", "b-short", "c-running"]
    assert re.search(r'<th aria-sort="ascending"><a class="sort" href="\?sort=-run"', page)
    assert _order(client.get("/runs/?sort=-run").content.decode()) == ["c-running", "b-short", "a-long"]
    assert _order(client.get("/runs/?sort=-devices").content.decode()) == ["a-long", "b-short", "c-running"]
    # a run that has not finished comes last both ways
    assert _order(client.get("/runs/?sort=-ran").content.decode()) == ["a-long", "b-short", "c-running"]
    assert _order(client.get("/runs/?sort=ran").content.decode()) == ["b-short", "a-long", "c-running"]
    assert _order(client.get("/runs/?sort=finished").content.decode())[-1] == "c-running"
    # the default, newest first, is the Submitted column descending; a column's first click
    # sorts the largest first where that is what people look for
    page = client.get("/runs/?state=&q=").content.decode()
    assert re.search(r'<th aria-sort="descending"><a class="sort" href="\?state=&amp;q=&amp;sort=submitted"', page)
    assert 'href="?state=&amp;q=&amp;sort=-devices"' in page
    # the sort chosen by a header is kept by the filter form's polls
    page = client.get("/runs/?sort=-devices").content.decode()
    assert '<option value="-devices" selected>by devices, descending</option>' in page
    # an unknown order is the default
    assert _order(client.get("/runs/?sort=bogus").content.decode()) == ["c-running", "a-long", "b-short"]


def test_the_list_shows_tags_and_filters_by_them(signed_in, experiment, users):
    tagged = make_run(experiment, users["owner"], name="tagged")
    make_run(experiment, users["owner"], name="plain")
    services.annotate_run(tagged, tags=["Paper", "best run"])
    client = signed_in("viewer")

    page = client.get("/runs/").content.decode()
    assert 'href="?tag=best%20run" data-testid="tag">best run</a>' in page
    assert "<option>Paper</option>" in page
    assert _order(client.get("/runs/?tag=paper").content.decode()) == ["tagged"]
    assert _order(client.get("/runs/?q=best").content.decode()) == ["tagged"]
    assert "<option selected>nothing</option>" in client.get("/runs/?tag=nothing").content.decode()


def test_the_last_status_poll_of_an_ended_run_refreshes_the_other_parts(signed_in, experiment, users):
    run = make_run(experiment, users["owner"], state=RunState.RUNNING)
    client = signed_in("viewer")
    parts = ("checkpoints", "samples", "tools")

    assert "HX-Trigger" not in client.get(f"/runs/{run.pk}/status/").headers
    for part in parts:  # polled while the run is active, and once more when it ends
        assert "run-ended from:body" in client.get(f"/runs/{run.pk}/{part}/").content.decode(), part
    Run.objects.filter(pk=run.pk).update(state=RunState.SUCCEEDED)
    assert client.get(f"/runs/{run.pk}/status/").headers["HX-Trigger"] == "run-ended"
    for part in parts:
        assert "hx-get" not in client.get(f"/runs/{run.pk}/{part}/").content.decode(), part
