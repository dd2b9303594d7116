"""The one adapter to a Ray cluster: submit, watch, stop and list jobs, and read its nodes.

Every call goes over HTTP to the cluster's dashboard address (its Jobs API, `http://head:8265`).
A cluster that cannot be reached, or that refuses the token, raises ClusterError with a message
naming the address and what to do.

Token authentication (Ray >= 2.5x, `RAY_AUTH_MODE=token`): the dashboard answers 401 to a request
without `Authorization: Bearer <token>` and 403 to a wrong token. An explicit `token` is sent as
that header; without one the Ray SDK adds the token it finds itself, but only when token mode is
on in this process (`RAY_AUTH_MODE=token`): from `RAY_AUTH_TOKEN`, the file named by
`RAY_AUTH_TOKEN_PATH`, or `~/.ray/auth_token`.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import requests
from ray.exceptions import AuthenticationError
from ray.job_submission import JobDetails, JobSubmissionClient
from ray.util.state import StateApiClient
from ray.util.state.common import ListApiOptions, StateResource
from ray.util.state.exception import RayStateApiException, ServerUnavailable

STATUSES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED", "MISSING")
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
DEVICE_RESOURCES = ("CPU", "GPU", "NPU")  # always present in a node's resources, 0 when absent


class ClusterError(Exception):
    """The cluster cannot be used as asked: unreachable, refusing the token, or rejecting a call."""


class JobNotFound(LookupError):
    """The cluster has no job with this submission id: never submitted, or lost with its head."""


@dataclass(frozen=True)
class JobState:
    """A job as the cluster reports it. `status` is one of STATUSES; MISSING: no such job."""

    submission_id: str
    status: str
    message: str = ""
    error_type: str | None = None  # Ray's kind of failure, e.g. JOB_ENTRYPOINT_COMMAND_ERROR
    start_time: datetime | None = None
    end_time: datetime | None = None
    exit_code: int | None = None  # the entrypoint's exit status, once it has ended
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


class _JobsClient(JobSubmissionClient):
    """Ray's Jobs SDK client with a timeout on every request (the SDK sets none)."""

    def __init__(self, address: str, headers: dict[str, str], timeout_s: float):
        self._timeout_s = timeout_s  # first: the SDK's constructor already sends requests
        super().__init__(address, headers=dict(headers))

    def _do_request(self, method, endpoint, **kwargs):
        kwargs.setdefault("timeout", self._timeout_s)
        return super()._do_request(method, endpoint, **kwargs)


class RayJobs:
    """Jobs on one Ray cluster, reached at its dashboard address, e.g. `http://head:8265`.

    Nothing is sent until the first call. `timeout_s` bounds each HTTP request.
    """

    def __init__(self, address: str, *, token: str | None = None, timeout_s: float = 10.0):
        self.address = address.rstrip("/")
        self.timeout_s = timeout_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client: _JobsClient | None = None

    def submit(
        self,
        submission_id: str,
        entrypoint: str,
        *,
        runtime_env: dict,
        entrypoint_resources: dict[str, float] | None = None,
        entrypoint_num_cpus: float | None = None,
        entrypoint_num_gpus: float | None = None,
        metadata: dict[str, str] | None = None,
    ) -> str:
        """Start a job, or find the one already submitted under this id; returns the id.

        Idempotent: a second submit with the same id creates nothing, whatever its arguments.
        Right after a head starts, its job agent may not be registered yet; that is retried for
        up to `timeout_s`.
        """
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                with self._errors():
                    return self._jobs().submit_job(
                        entrypoint=entrypoint, submission_id=submission_id,
                        runtime_env=runtime_env, metadata=metadata,
                        entrypoint_num_cpus=entrypoint_num_cpus,
                        entrypoint_num_gpus=entrypoint_num_gpus,
                        entrypoint_resources=entrypoint_resources,
                    )
            except RuntimeError as exc:
                if "already exists" in str(exc):
                    return submission_id
                if "No available agent" not in str(exc) or time.monotonic() > deadline:
                    raise self._rejected(f"did not accept job {submission_id!r}", exc) from exc
            time.sleep(0.5)

    def status(self, submission_id: str) -> JobState:
        """The job's state; status MISSING when the cluster does not know the id."""
        try:
            with self._errors():
                return _job_state(self._jobs().get_job_info(submission_id))
        except RuntimeError as exc:
            if _not_found(exc):
                return JobState(submission_id, "MISSING", "the cluster has no job with this id")
            raise self._rejected(f"did not report job {submission_id!r}", exc) from exc

    def logs(self, submission_id: str, offset: int = 0) -> tuple[str, int]:
        """The log text after `offset` characters, and the offset to ask from next time.

        Raises JobNotFound when the cluster does not know the id.
        """
        try:
            with self._errors():
                text = self._jobs().get_job_logs(submission_id)
        except RuntimeError as exc:
            if _not_found(exc):
                raise JobNotFound(
                    f"the Ray cluster at {self.address} has no job {submission_id!r}") from None
            raise self._rejected(f"did not return the logs of job {submission_id!r}", exc) from exc
        return text[offset:], max(offset, len(text))

    def stop(self, submission_id: str) -> bool:
        """Ask the job to stop: True if it was pending or running, False if it had ended or
        is unknown."""
        try:
            with self._errors():
                return self._jobs().stop_job(submission_id)
        except RuntimeError as exc:
            if _not_found(exc):
                return False
            raise self._rejected(f"did not stop job {submission_id!r}", exc) from exc

    def list(self) -> list[JobState]:
        """Every submitted job the cluster remembers (drivers started by hand are left out)."""
        try:
            with self._errors():
                jobs = self._jobs().list_jobs()
        except RuntimeError as exc:
            raise self._rejected("did not list its jobs", exc) from exc
        return [_job_state(job) for job in jobs if job.submission_id]

    def cluster_resources(self) -> list[dict]:
        """The cluster's nodes for the inventory probe, dead ones included: `[{"node_id",
        "node_name", "node_ip", "hostname", "is_head", "alive", "resources", "labels"}]`.

        `resources` holds the node's total resources (CPU, GPU and NPU always present; memory in
        bytes; Ray's `node:*` markers left out). `hostname` comes from the dashboard's node
        summary where it answers, else it is the node name.
        """
        client = StateApiClient(self.address, headers=dict(self._headers) or None)
        options = ListApiOptions(detail=True, timeout=max(1, round(self.timeout_s)))
        try:
            with self._errors():
                nodes = client.list(StateResource.NODES, options=options,
                                    raise_on_missing_output=False)
        except RayStateApiException as exc:
            raise self._rejected("did not list its nodes", exc) from exc
        hostnames = self._hostnames()
        return [_node(node, hostnames.get(node.node_id, node.node_name)) for node in nodes]

    # -- internals ---------------------------------------------------------------------------

    def _jobs(self) -> _JobsClient:
        if self._client is None:
            self._client = _JobsClient(self.address, self._headers, self.timeout_s)
        return self._client

    def _hostnames(self) -> dict[str, str]:
        """Node id -> host name, from the dashboard's node summary (not part of Ray's public API,
        so any failure just leaves the names out)."""
        try:
            with self._errors():
                response = self._jobs()._do_request("GET", "/nodes", params={"view": "summary"})
            rows = response.json()["data"]["summary"]
            return {row["raylet"]["nodeId"]: row["hostname"] for row in rows}
        except (ClusterError, RuntimeError, ValueError, KeyError, TypeError):
            return {}

    @contextmanager
    def _errors(self):
        """Turn failures to reach or authenticate with the cluster into ClusterError."""
        try:
            yield
        except AuthenticationError as exc:
            raise ClusterError(self._auth_message(str(exc))) from exc
        except requests.exceptions.Timeout as exc:
            raise ClusterError(
                f"the Ray cluster at {self.address} did not answer within {self.timeout_s:g} s: "
                "is the address right and its head healthy?"
            ) from exc
        except (requests.exceptions.ConnectionError, ConnectionError, ServerUnavailable) as exc:
            raise ClusterError(
                f"cannot reach the Ray cluster at {self.address}: {_reason(exc)} — is its head "
                "running, and is this its dashboard address (port 8265 by default)?"
            ) from exc

    def _auth_message(self, detail: str) -> str:
        where = "print it on the cluster's head with `ray get-auth-token`"
        if detail.startswith("Authentication required"):  # 401: no token was sent
            return (f"the Ray cluster at {self.address} requires a token and none was sent: "
                    f"set the cluster's token ({where}) for this cluster")
        return (f"the Ray cluster at {self.address} refused the token: "
                f"set the cluster's token ({where}) for this cluster")

    def _rejected(self, what: str, exc: Exception) -> ClusterError:
        return ClusterError(f"the Ray cluster at {self.address} {what}: {exc}")


def _not_found(exc: RuntimeError) -> bool:
    return "status code 404" in str(exc)


def _reason(exc: BaseException) -> str:
    """A short cause for a failed connection, looking through chained exceptions."""
    text = ""
    while exc is not None:
        text += f" {exc}"
        exc = exc.__cause__ or exc.__context__
    lowered = text.lower()
    if "refused" in lowered:
        return "connection refused"
    if "resolve" in lowered or "name or service not known" in lowered:
        return "its host name does not resolve"
    if "timed out" in lowered:
        return "no answer"
    return "the connection failed"


def _time(milliseconds: int | None) -> datetime | None:
    return datetime.fromtimestamp(milliseconds / 1000, tz=UTC) if milliseconds else None


def _job_state(job: JobDetails) -> JobState:
    return JobState(
        submission_id=job.submission_id,
        status=str(getattr(job.status, "value", job.status)),
        message=job.message or "",
        error_type=job.error_type,
        start_time=_time(job.start_time),
        end_time=_time(job.end_time),
        exit_code=getattr(job, "driver_exit_code", None),
        metadata=dict(job.metadata or {}),
    )


def _node(node, hostname: str) -> dict:
    resources = {name: 0.0 for name in DEVICE_RESOURCES}
    resources.update({k: v for k, v in node.resources_total.items() if not k.startswith("node:")})
    return {
        "node_id": node.node_id,
        "node_name": node.node_name,
        "node_ip": node.node_ip,
        "hostname": hostname,
        "is_head": bool(node.is_head_node),
        "alive": node.state == "ALIVE",
        "resources": resources,
        "labels": dict(node.labels or {}),
    }
