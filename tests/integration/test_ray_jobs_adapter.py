"""The Ray Jobs adapter against a real Ray head that enforces a token."""

from __future__ import annotations

import time
import uuid

import pytest

from workers.ray_jobs import ClusterError, JobNotFound, JobState, RayJobs

HELLO = "python -c \"print('hello'); import sys; sys.exit(0)\""
EXIT_3 = "python -c \"import sys; print('failing'); sys.exit(3)\""


@pytest.fixture(scope="module")
def jobs(ray_head, ray_head_token) -> RayJobs:
    return RayJobs(ray_head, token=ray_head_token, timeout_s=30)


@pytest.fixture(scope="module")
def submitted(jobs) -> dict[str, str]:
    """The module's jobs, submitted together so they run side by side."""
    tag = uuid.uuid4().hex[:8]
    ids = {"hello": f"hello-{tag}", "exit3": f"exit3-{tag}", "sleep": f"sleep-{tag}"}
    jobs.submit(ids["hello"], HELLO, runtime_env={}, metadata={"run": "7", "attempt": "1"})
    jobs.submit(ids["exit3"], EXIT_3, runtime_env={})
    jobs.submit(ids["sleep"], "sleep 60", runtime_env={})
    return ids


def wait_for(jobs: RayJobs, submission_id: str, *statuses: str, timeout: float = 60) -> JobState:
    deadline = time.monotonic() + timeout
    while (state := jobs.status(submission_id)).status not in statuses:
        assert time.monotonic() < deadline, f"{submission_id} still {state.status}: {state.message}"
        time.sleep(0.3)
    return state


def test_it_submits_once_per_submission_id(jobs, submitted):
    again = jobs.submit(submitted["hello"], HELLO, runtime_env={})

    assert again == submitted["hello"]
    assert [j.submission_id for j in jobs.list()].count(submitted["hello"]) == 1


def test_a_finished_job_succeeds_with_exit_code_0(jobs, submitted):
    state = wait_for(jobs, submitted["hello"], "SUCCEEDED", "FAILED", "STOPPED")

    assert state.status == "SUCCEEDED" and state.terminal
    assert state.exit_code == 0
    assert state.metadata == {"run": "7", "attempt": "1"}
    assert state.start_time is not None and state.end_time >= state.start_time


def test_logs_are_read_incrementally(jobs, submitted):
    wait_for(jobs, submitted["hello"], "SUCCEEDED")

    text, offset = jobs.logs(submitted["hello"])
    assert "hello" in text and offset == len(text)
    assert jobs.logs(submitted["hello"], offset) == ("", offset)
    assert jobs.logs(submitted["hello"], 2) == (text[2:], offset)


def test_a_failing_job_fails_with_its_exit_code(jobs, submitted):
    state = wait_for(jobs, submitted["exit3"], "SUCCEEDED", "FAILED", "STOPPED")

    assert state.status == "FAILED"
    assert state.exit_code == 3
    assert "exit code 3" in state.message
    assert "failing" in jobs.logs(submitted["exit3"])[0]


def test_a_stopped_job_is_stopped(jobs, submitted):
    wait_for(jobs, submitted["sleep"], "RUNNING")

    assert jobs.stop(submitted["sleep"]) is True
    assert wait_for(jobs, submitted["sleep"], "STOPPED", "FAILED", "SUCCEEDED").status == "STOPPED"
    assert jobs.stop(submitted["sleep"]) is False  # already ended


def test_an_unknown_job_is_missing(jobs):
    assert jobs.status("never-submitted").status == "MISSING"
    assert jobs.stop("never-submitted") is False
    with pytest.raises(JobNotFound):
        jobs.logs("never-submitted")


def test_the_inventory_lists_the_head_with_its_cpus(jobs):
    (node,) = jobs.cluster_resources()

    assert node["alive"] and node["is_head"]
    assert node["node_ip"] and node["hostname"]
    assert node["resources"]["CPU"] == 2.0
    assert node["resources"]["GPU"] == 0.0 and node["resources"]["NPU"] == 0.0
    assert not any(name.startswith("node:") for name in node["resources"])


def test_an_unreachable_cluster_is_a_cluster_error(unused_address):
    with pytest.raises(ClusterError) as caught:
        RayJobs(unused_address, timeout_s=5).status("any")

    assert str(caught.value).startswith(
        f"cannot reach the Ray cluster at {unused_address}: connection refused")
    assert "is its head running" in str(caught.value)


def test_a_wrong_token_is_refused(ray_head):
    with pytest.raises(ClusterError) as caught:
        RayJobs(ray_head, token="not-the-token").list()

    assert str(caught.value).startswith(f"the Ray cluster at {ray_head} refused the token: set the")


def test_the_head_refuses_calls_without_its_token(ray_head):
    # Without a token the SDK sends the one it finds locally when this process runs in token
    # mode (after `local_ray`, say: ~/.ray/auth_token, not this head's), else none: refused
    # either way (403 or 401).
    with pytest.raises(ClusterError) as caught:
        RayJobs(ray_head).list()

    assert str(caught.value).startswith(f"the Ray cluster at {ray_head} re")
    assert "token" in str(caught.value)
