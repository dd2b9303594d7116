"""When MLflow cannot be reached: the API answers 503 (the reason, which names MLflow's internal
address, goes to the service's log), and the web UI says so in place of a run's checkpoints, its
stage times and profiles, and of the comparison charts: the reason with the address for staff,
who run the service, a sentence without it for everyone else."""

from __future__ import annotations

import pytest

from experiments.models import Run
from tests.platform.embedded_server import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def mlflow_address(settings) -> str:
    """An MLflow address where nothing listens."""
    settings.MLFLOW_TRACKING_URI = f"http://127.0.0.1:{free_port()}"
    return settings.MLFLOW_TRACKING_URI


@pytest.fixture
def tracked_runs(experiment, users) -> list[Run]:
    spec = {"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}}}
    return [Run.objects.create(experiment=experiment, spec=spec, algorithm="grpo",
                               device_type="cpu", device_count=1, created_by=users["owner"],
                               name=f"run {n}", mlflow_run_id=f"{n:032x}") for n in (1, 2)]


def test_it_answers_503_naming_the_store_but_not_its_address(clients, tracked_runs,
                                                              mlflow_address, caplog):
    run = tracked_runs[0]

    for what in ("metrics", "artifacts"):
        response = clients["viewer"].get(f"/api/v1/runs/{run.pk}/{what}/")

        assert response.status_code == 503, what
        body = response.json()
        assert set(body) == {"error", "detail"}
        assert body["error"] == "tracking_unavailable"
        assert body["detail"] == "The metrics store (MLflow) cannot be reached; try again shortly."
        assert mlflow_address.split("//")[1] not in response.content.decode()
    # the reason, with the address, is in the service's log for its operators
    assert f"cannot reach the MLflow server at {mlflow_address}" in caplog.text


PUBLIC = "The metrics store (MLflow) cannot be reached; try again shortly."


def shows_the_reason_to_staff_only(login, path: str, mlflow_address: str) -> str:
    member = login("viewer").get(path)
    assert member.status_code == 200
    assert PUBLIC in member.content.decode()
    assert mlflow_address.split("//")[1] not in member.content.decode()
    staff = login("admin").get(path)
    assert staff.status_code == 200
    assert (f"MLflow did not answer: cannot reach the MLflow server at {mlflow_address}"
            in staff.content.decode())
    return member.content.decode()


def test_it_shows_the_reason_in_place_of_the_checkpoints(login, tracked_runs, mlflow_address):
    shows_the_reason_to_staff_only(login, f"/runs/{tracked_runs[0].pk}/checkpoints/",
                                   mlflow_address)


def test_it_shows_the_reason_in_place_of_the_stage_times_and_profiles(login, tracked_runs,
                                                                      mlflow_address):
    shows_the_reason_to_staff_only(login, f"/runs/{tracked_runs[0].pk}/tools/", mlflow_address)


def test_it_shows_the_reason_in_place_of_the_comparison(login, tracked_runs, mlflow_address):
    ids = ",".join(str(run.pk) for run in tracked_runs)

    page = shows_the_reason_to_staff_only(login, f"/compare/?runs={ids}", mlflow_address)
    assert "run 1" in page and "run 2" in page  # the spec diff is still shown
