"""Deletes racing creates, on PostgreSQL with threads: an experiment deleted while a run of it
restarts, a project deleted while a run in it is cloned. Whichever comes second finds the
first's result (a 409-worthy DomainError), never a foreign-key error. (A write is kept only with
its audit entry: tests/platform/test_audit.py.)"""

from __future__ import annotations

import pytest

from accounts.models import Project
from experiments.choices import RunState
from experiments.models import Experiment, Run
from ascent.errors import DomainError
from experiments.services import clone_run, delete_experiment, delete_project, restart_run
from tests.platform.racing import race

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cancelled(experiment, users, tiny_spec) -> Run:
    return Run.objects.create(experiment=experiment, spec=tiny_spec, algorithm="grpo",
                              device_type="cpu", device_count=1, name="base",
                              created_by=users["owner"], state=RunState.CANCELLED)


def outcome(action) -> str:
    try:
        action()
        return "done"
    except DomainError as exc:
        return f"refused: {exc}"


@pytest.mark.parametrize("rounds", range(3))
def test_deleting_an_experiment_while_a_run_of_it_restarts(cancelled, experiment, users, rounds):
    restart = lambda: outcome(lambda: restart_run(Run.objects.get(pk=cancelled.pk),  # noqa: E731
                                                  users["owner"]))
    delete = lambda: outcome(lambda: delete_experiment(  # noqa: E731
        Experiment.objects.get(pk=experiment.pk)))
    # Both get past their reads, then wait on the experiment's row: the lock decides the order.
    restarted, deleted = race([restart, delete], "experiments_experiment", experiment.pk)

    if Experiment.objects.filter(pk=experiment.pk).exists():  # the restart came first
        assert restarted == "done"
        assert deleted.startswith("refused: This experiment has 1 unfinished run"), deleted
        assert Run.objects.filter(resume_from=cancelled).count() == 1
    else:
        assert deleted == "done"
        assert restarted == f"refused: Experiment {experiment.pk} was deleted meanwhile: submit " \
                            "the run to another experiment.", restarted
        assert not Run.objects.exists()


@pytest.mark.parametrize("rounds", range(3))
def test_deleting_a_project_while_a_run_in_it_is_cloned(cancelled, project, experiment, users,
                                                        rounds):
    clone = lambda: outcome(lambda: clone_run(Run.objects.get(pk=cancelled.pk),  # noqa: E731
                                              users["owner"]))
    delete = lambda: outcome(lambda: delete_project(Project.objects.get(pk=project.pk)))  # noqa: E731
    cloned, deleted = race([clone, delete], "experiments_experiment", experiment.pk)

    if Project.objects.filter(pk=project.pk).exists():
        assert cloned == "done"
        assert deleted.startswith("refused: This project has 1 unfinished run"), deleted
        assert Run.objects.filter(cloned_from=cancelled).count() == 1
    else:
        assert deleted == "done" and cloned.startswith("refused: Experiment"), cloned
        assert not Run.objects.exists()


def test_the_api_answers_a_delete_of_a_busy_experiment_with_409(clients, experiment, cancelled):
    Run.objects.filter(pk=cancelled.pk).update(state=RunState.RUNNING)
    response = clients["owner"].delete(f"/api/v1/experiments/{experiment.pk}/")
    assert response.status_code == 409 and "unfinished run" in response.json()["detail"]
    assert Experiment.objects.filter(pk=experiment.pk).exists()
