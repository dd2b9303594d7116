"""The run state machine: one transition function, a conditional UPDATE, an event per change."""

from __future__ import annotations

import threading

import pytest

from experiments.choices import TERMINAL_STATES, TRANSITIONS, RunState, can_transition
from experiments.models import Run
from ascent.errors import DomainError
from experiments.services import IllegalTransition, restart_run, transition
from tests.platform.racing import race

S = RunState


def sources_of(target: str) -> frozenset[RunState]:
    """Every state from which `target` may be entered."""
    return frozenset(s for s, targets in TRANSITIONS.items() if RunState(target) in targets)


def make_run(experiment, state=S.QUEUED) -> Run:
    return Run.objects.create(experiment=experiment, spec={}, algorithm="grpo", device_type="cpu",
                              device_count=1, state=state)


def test_it_matches_the_lifecycle_of_the_design():
    happy = [S.QUEUED, S.SCHEDULED, S.STARTING, S.RUNNING, S.SUCCEEDED]
    assert all(can_transition(a, b) for a, b in zip(happy, happy[1:]))
    assert can_transition(S.RUNNING, S.CANCELLING) and can_transition(S.CANCELLING, S.CANCELLED)
    assert can_transition(S.RUNNING, S.RESTARTING) and can_transition(S.RESTARTING, S.STARTING)
    for terminal in TERMINAL_STATES:
        assert TRANSITIONS[terminal] == frozenset()
    assert not can_transition(S.QUEUED, S.RUNNING)
    assert sources_of(S.CANCELLED) == {S.QUEUED, S.SCHEDULED, S.RESTARTING, S.CANCELLING}


def test_it_moves_and_records_an_event(experiment):
    run = make_run(experiment)
    run = transition(run, S.SCHEDULED, actor="system:scheduler", message="placed on npu-a")
    assert run.state == S.SCHEDULED
    event = run.events.get()
    assert (event.from_state, event.to_state, event.actor, event.message) == (
        "QUEUED", "SCHEDULED", "system:scheduler", "placed on npu-a")


def test_it_stamps_start_and_finish_times(experiment):
    run = make_run(experiment, S.STARTING)
    run = transition(run, S.RUNNING, actor="w")
    started = run.started_at
    assert started is not None and run.finished_at is None
    run = transition(run, S.RESTARTING, actor="w")
    run = transition(run, S.STARTING, actor="w")
    run = transition(run, S.RUNNING, actor="w")
    assert run.started_at == started  # the first start is kept across attempts
    run = transition(run, S.FAILED, actor="w", error="exit code 1")
    assert run.finished_at is not None and run.error == "exit code 1"


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES))
def test_it_refuses_to_leave_a_terminal_state(experiment, state):
    run = make_run(experiment, state)
    with pytest.raises(IllegalTransition, match=f"is {state}; it cannot move to RUNNING"):
        transition(run, S.RUNNING, actor="w")
    run.refresh_from_db()
    assert run.state == state and not run.events.exists()


def test_it_refuses_an_illegal_move(experiment):
    run = make_run(experiment)
    with pytest.raises(IllegalTransition):
        transition(run, S.RUNNING, actor="w")
    assert Run.objects.get(pk=run.pk).state == S.QUEUED


def test_it_refuses_when_the_state_is_not_the_expected_one(experiment):
    run = make_run(experiment, S.SCHEDULED)
    with pytest.raises(IllegalTransition, match="expected QUEUED"):
        transition(run, S.SCHEDULED, actor="w", expected=S.QUEUED)
    assert not run.events.exists()


def test_a_redelivered_message_acts_once(experiment):
    run = make_run(experiment)
    transition(run, S.SCHEDULED, actor="w", expected=S.QUEUED)
    with pytest.raises(IllegalTransition):
        transition(run, S.SCHEDULED, actor="w", expected=S.QUEUED)
    assert run.events.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("expected", [S.QUEUED, None], ids=["expected-state", "any-legal-source"])
def test_two_connections_racing_one_transition_exactly_one_wins(experiment, expected):
    run = make_run(experiment)

    def racer() -> str:
        try:
            transition(run.pk, S.SCHEDULED, actor=threading.current_thread().name, expected=expected)
            return "won"
        except IllegalTransition:
            return "lost"

    # Both racers read QUEUED, then queue up behind the lock inside their conditional UPDATE.
    outcomes = race([racer, racer], "experiments_run", run.pk)

    assert sorted(outcomes) == ["lost", "won"]
    assert run.events.count() == 1
    assert Run.objects.get(pk=run.pk).state == S.SCHEDULED


@pytest.mark.django_db(transaction=True)
def test_concurrent_restarts_of_one_run_make_one_run(experiment, users, tiny_spec):
    """Ten restarts at once of a cancelled run: one new run, nine told it exists (the API's 409),
    not ten runs writing into one output folder."""
    run = make_run(experiment, state=S.CANCELLED)
    Run.objects.filter(pk=run.pk).update(spec=tiny_spec, name="base")

    def racer() -> str:
        try:
            restart_run(Run.objects.get(pk=run.pk), users["owner"])
            return "won"
        except DomainError as exc:
            return "lost" if "already continues" in str(exc) else repr(exc)

    # Every racer reads the run as restartable, then queues up behind a row lock.
    outcomes = race([racer] * 10, "experiments_run", run.pk)

    assert sorted(outcomes) == ["lost"] * 9 + ["won"], outcomes
    assert Run.objects.filter(resume_from=run).count() == 1
