"""A small client of Ascent's REST API for pipelines and scripts (the `ascent` command is built
on it). It needs `requests` only: no Django, torch or rl_core.

    from ascent_client import Client
    client = Client()                            # ASCENT_URL and ASCENT_TOKEN from the environment
    run = client.submit("vision/counting", spec, overrides=["trainer.total_steps=20"],
                        idempotency_key=client.pipeline_key(spec))
    for text in client.follow(run["id"]):        # the log as it grows, attempt after attempt
        print(text, end="")
    run = client.wait(run["id"])                 # SUCCEEDED, FAILED or CANCELLED
    client.metrics(run["id"], keys=["reward/mean"])

Every call is one of `ENDPOINTS` (the test suite checks each against the server's OpenAPI
schema). A refused request raises `ApiError` with the server's message (a 400 names each bad
field of the spec); an unreachable server raises `ConnectionError` naming the URL.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import requests

# The calls this client makes: name -> (method, path template of the OpenAPI schema).
ENDPOINTS: dict[str, tuple[str, str]] = {
    "projects": ("GET", "/api/v1/projects/"),
    "experiments": ("GET", "/api/v1/experiments/"),
    "submit": ("POST", "/api/v1/runs/"),
    "run": ("GET", "/api/v1/runs/{id}/"),
    "cancel": ("POST", "/api/v1/runs/{id}/cancel/"),
    "logs": ("GET", "/api/v1/runs/{id}/logs/"),
    "metrics": ("GET", "/api/v1/runs/{id}/metrics/"),
    "register": ("POST", "/api/v1/model-versions/"),
    "version": ("GET", "/api/v1/model-versions/{id}/"),
}
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")
# What identifies a pipeline's job across its retries, by CI system: the variables that stay
# the same when a job is retried (a retry must find the run the first try submitted).
PIPELINE_VARIABLES = (
    ("GITHUB_RUN_ID", ("GITHUB_REPOSITORY", "GITHUB_RUN_ID", "GITHUB_JOB")),
    ("CI_PIPELINE_ID", ("CI_PROJECT_PATH", "CI_PIPELINE_ID", "CI_JOB_NAME")),  # GitLab
    ("AIRFLOW_CTX_DAG_RUN_ID", ("AIRFLOW_CTX_DAG_ID", "AIRFLOW_CTX_DAG_RUN_ID",
                                "AIRFLOW_CTX_TASK_ID")),
    ("BUILD_TAG", ("BUILD_TAG",)),  # Jenkins
)
MAX_KEY = 128  # the server's limit on Idempotency-Key


class ApiError(Exception):
    """The server refused a request: `status` (HTTP) and `body` (its JSON answer or text)."""

    def __init__(self, status: int, body: Any, what: str):
        self.status, self.body = status, body
        super().__init__(f"{what}: HTTP {status}: {describe(body)}")


def describe(body: Any) -> str:
    """An error answer of the API as one line: the message and each field's problems."""
    if not isinstance(body, Mapping):
        return str(body)[:500]
    parts = [str(body.get("detail") or "")]
    for error in body.get("errors") or []:
        if isinstance(error, Mapping):
            parts.append(f"{error.get('field', '')}: {error.get('message', '')}".strip(": "))
    fields = {k: v for k, v in body.items() if k not in ("error", "detail", "errors")}
    parts += [f"{k}: {' '.join(map(str, v)) if isinstance(v, list) else v}"
              for k, v in fields.items()]
    return "; ".join(p for p in parts if p) or json.dumps(body)[:500]


class Client:
    """Ascent's API at `url` (default ASCENT_URL), authenticated by the API token `token`
    (default ASCENT_TOKEN; create one in Settings → API tokens)."""

    def __init__(self, url: str | None = None, token: str | None = None, *,
                 timeout: float = 30.0, session: requests.Session | None = None):
        url = url or os.environ.get("ASCENT_URL", "")
        token = token or os.environ.get("ASCENT_TOKEN", "")
        if not url:
            raise ValueError("no Ascent server: set ASCENT_URL (e.g. https://ascent.example.org) "
                             "or pass --url")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"ASCENT_URL must start with http:// or https://, got {url!r}")
        if not token:
            raise ValueError("no API token: set ASCENT_TOKEN (create one in Settings → API "
                             "tokens) or pass --token")
        self.url, self.timeout = url.rstrip("/"), timeout
        self.session = session or requests.Session()
        self.session.headers.update({"Authorization": f"Bearer {token}",
                                     "Accept": "application/json"})

    # ----------------------------------------------------------------------- requests

    def call(self, name: str, *, params: Mapping[str, Any] | None = None,
             body: Any = None, headers: Mapping[str, str] | None = None, **path: Any) -> Any:
        """One of `ENDPOINTS`, its path filled from `path`; the answer's JSON."""
        method, template = ENDPOINTS[name]
        return self._request(method, self.url + template.format(**path), params=params,
                             body=body, headers=headers)

    def _request(self, method: str, url: str, *, params: Mapping[str, Any] | None = None,
                 body: Any = None, headers: Mapping[str, str] | None = None) -> Any:
        return self._send(method, url, params=params, body=body, headers=headers).json()

    def _send(self, method: str, url: str, *, params: Mapping[str, Any] | None = None,
              body: Any = None, headers: Mapping[str, str] | None = None) -> requests.Response:
        """The response; ApiError for an answer of 400 or more, ConnectionError when the server
        cannot be reached."""
        what = f"{method} {url}"
        try:
            response = self.session.request(method, url, params=params, json=body,
                                            headers=dict(headers or {}), timeout=self.timeout)
        except requests.RequestException as exc:
            raise ConnectionError(f"{what}: the Ascent server cannot be reached ({exc}); check "
                                  "ASCENT_URL") from exc
        if response.status_code >= 400:
            try:
                answer = response.json()
            except ValueError:
                answer = response.text
            raise ApiError(response.status_code, answer, what)
        return response

    def _pages(self, name: str, params: Mapping[str, Any] | None = None) -> Iterator[dict]:
        """Every item of a paginated list."""
        page = self.call(name, params=params)
        while True:
            yield from page.get("results", []) if isinstance(page, Mapping) else page
            following = page.get("next") if isinstance(page, Mapping) else None
            if not following:
                return
            page = self._request("GET", following)

    # ----------------------------------------------------------------------- runs

    def experiment_id(self, ref: str | int) -> int:
        """An experiment's id from its id or `project/experiment` (names as in the UI)."""
        text = str(ref).strip()
        if text.isascii() and text.isdigit():
            return int(text)
        project_name, _, name = text.partition("/")
        if not project_name or not name:
            raise ValueError(f"experiment {text!r}: give its id or project/experiment")
        projects = [p for p in self._pages("projects") if p.get("name") == project_name]
        if not projects:
            raise ValueError(f"experiment {text!r}: no project named {project_name!r} that "
                             "this token can see")
        for experiment in self._pages("experiments", {"project": projects[0]["id"]}):
            if experiment.get("name") == name:
                return int(experiment["id"])
        raise ValueError(f"experiment {text!r}: project {project_name!r} has no experiment "
                         f"named {name!r}")

    def submit(self, experiment: str | int, spec: Mapping[str, Any], *,
               overrides: Sequence[str] = (), name: str = "", priority: int | None = None,
               max_restarts: int | None = None, cluster: str | None = None,
               preemptible: bool | None = None, idempotency_key: str | None = None) -> dict:
        """Submit a run; the run (with `created`: False when `idempotency_key` found the run an
        earlier submission made)."""
        body: dict[str, Any] = {"experiment": self.experiment_id(experiment), "spec": dict(spec),
                                "overrides": list(overrides), "name": name}
        for key, value in (("priority", priority), ("max_restarts", max_restarts),
                           ("cluster", cluster), ("preemptible", preemptible)):
            if value is not None:
                body[key] = value
        headers = {"Idempotency-Key": idempotency_key[:MAX_KEY]} if idempotency_key else {}
        method, template = ENDPOINTS["submit"]
        response = self._send(method, self.url + template, body=body, headers=headers)
        return {**response.json(), "created": response.status_code == 201}

    def run(self, run_id: int) -> dict:
        return self.call("run", id=run_id)

    def cancel(self, run_id: int) -> dict:
        """Ask the run to stop (it passes through CANCELLING); the run."""
        return self.call("cancel", id=run_id)

    def metrics(self, run_id: int, keys: Sequence[str] = (), max_points: int | None = None
                ) -> dict:
        """Metric names, latest values and the histories of `keys` ([step, value, time])."""
        params: dict[str, Any] = {}
        if keys:
            params["keys"] = ",".join(keys)
        if max_points is not None:
            params["max_points"] = max_points
        return self.call("metrics", id=run_id, params=params)

    def wait(self, run_id: int, *, poll: float = 5.0, timeout: float | None = None,
             on_state: Any = None) -> dict:
        """Until the run has ended (SUCCEEDED, FAILED, CANCELLED); the run. `on_state(run)` is
        called at each change of state; TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        state = None
        while True:
            run = self.run(run_id)
            if run["state"] != state:
                state = run["state"]
                if on_state is not None:
                    on_state(run)
            if state in TERMINAL_STATES:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} is still {state} after {timeout:g} s")
            time.sleep(poll)

    def register(self, run_id: int, name: str, *, step: int | None = None,
                 aliases: Sequence[str] = (), description: str = "") -> dict:
        """Register the run's checkpoint at `step` (default: its latest) as a new version of
        model `name`; the version, `pending` while the server exports it."""
        body: dict[str, Any] = {"run": run_id, "name": name, "aliases": list(aliases),
                                "description": description}
        if step is not None:
            body["step"] = step
        return self.call("register", body=body)

    def version(self, version_id: int) -> dict:
        return self.call("version", id=version_id)

    def wait_version(self, version_id: int, *, poll: float = 5.0,
                     timeout: float | None = None) -> dict:
        """Until the version is no longer `pending` (`ready` or `failed`); the version."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            version = self.version(version_id)
            if version["state"] != "pending":
                return version
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"model version {version_id} is still being exported after "
                                   f"{timeout:g} s")
            time.sleep(poll)

    def follow(self, run_id: int, *, poll: float = 2.0, timeout: float | None = None
               ) -> Iterator[str]:
        """The run's log as it grows, every attempt's in turn (a line naming each new
        attempt before its text), until the run has ended and its last attempt's log is
        complete."""
        deadline = None if timeout is None else time.monotonic() + timeout
        attempt, offset = None, 0
        while True:
            run = self.run(run_id)
            ended = run["state"] in TERMINAL_STATES
            params: dict[str, Any] = {"offset": offset}
            if attempt is not None:
                params["attempt"] = attempt
            page = self.call("logs", id=run_id, params=params)
            if page["attempt"] is not None and attempt is None:
                attempt = page["attempt"]
                yield f"──── run {run_id}, attempt {attempt} ────\n"
            if page["text"]:
                yield page["text"]
            offset = page["offset"]
            latest = max((a["number"] for a in run.get("attempts") or []), default=attempt)
            if attempt is not None and page["complete"] and latest is not None \
                    and latest > attempt:
                attempt, offset = latest, 0  # a restart: on to the next attempt's log
                yield f"──── run {run_id}, attempt {attempt} ────\n"
                continue
            if ended and (attempt is None or page["complete"]):
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} is still {run['state']} after {timeout:g} s")
            if not page["text"]:
                time.sleep(poll)

    @staticmethod
    def pipeline_key(spec: Mapping[str, Any], overrides: Sequence[str] = (),
                     experiment: str | int = "", environ: Mapping[str, str] | None = None
                     ) -> str | None:
        """An Idempotency-Key for a submission from a CI job (GitHub Actions, GitLab CI,
        Airflow, Jenkins): the job's identity, which a retry keeps, and a digest of what is
        submitted (two different submissions of one job stay apart). None outside a pipeline."""
        environ = os.environ if environ is None else environ
        for marker, names in PIPELINE_VARIABLES:
            if environ.get(marker):
                job = "/".join(environ.get(n, "") for n in names)
                digest = hashlib.sha256(json.dumps(
                    [str(experiment), spec, list(overrides)], sort_keys=True).encode()
                ).hexdigest()[:16]
                return f"{job[:MAX_KEY - 18]}:{digest}"
        return None


__all__ = ["ApiError", "Client", "ENDPOINTS", "TERMINAL_STATES"]
