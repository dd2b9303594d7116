"""When MLflow cannot be reached: the API answers 503 with the reason, and the web UI shows the
same reason in place of a run's checkpoints, its stage times and profiles, and of the comparison
charts."""

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


def test_it_answers_503_with_the_reason_in_the_api(clients, tracked_runs, mlflow_address):
    run = tracked_runs[0]

    for what in ("metrics", "artifacts"):
        response = clients["viewer"].get(f"/api/v1/runs/{run.pk}/{what}/")

        assert response.status_code == 503, what
        body = response.json()
        assert set(body) == {"error", "detail"}
        assert body["error"] == "error"
        assert body["detail"].startswith(f"cannot reach the MLflow server at {mlflow_address}")


def test_it_shows_the_reason_in_place_of_the_checkpoints(login, tracked_runs, mlflow_address):
    run = tracked_runs[0]

    response = login("viewer").get(f"/runs/{run.pk}/checkpoints/")

    assert response.status_code == 200
    assert (f"MLflow did not answer: cannot reach the MLflow server at {mlflow_address}"
            in response.content.decode())


def test_it_shows_the_reason_in_place_of_the_stage_times_and_profiles(login, tracked_runs,
                                                                      mlflow_address):
    response = login("viewer").get(f"/runs/{tracked_runs[0].pk}/tools/")

    assert response.status_code == 200
    assert (f"MLflow did not answer: cannot reach the MLflow server at {mlflow_address}"
            in response.content.decode())


def test_it_shows_the_reason_in_place_of_the_comparison(login, tracked_runs, mlflow_address):
    ids = ",".join(str(run.pk) for run in tracked_runs)

    response = login("viewer").get(f"/compare/?runs={ids}")

    assert response.status_code == 200
    page = response.content.decode()
    assert f"MLflow did not answer: cannot reach the MLflow server at {mlflow_address}" in page
    assert "run 1" in page and "run 2" in page  # the spec diff is still shown
