"""A reward computed by an HTTP service (`reward.remote`).

    remote = RemoteReward("https://rewards.example.com/score", token_env="REWARD_TOKEN",
                          timeout_s=30, retries=3, backoff_s=0.5, max_concurrency=8)
    batch = remote.score_batch(prompts, responses, truths)
    batch.scores, batch.metrics()    # [n] floats; {"reward/remote/latency_mean_s": ...}
    remote.close()

Protocol: one POST per response to `url` with the JSON body
`{"prompt": str | null, "response": str, "ground_truth": any}` (the prompt is null where the
caller has none) and, with `token_env`, the header `Authorization: Bearer <token>`, the token
read from that environment variable at scoring time. The answer must be a 2xx status with the
JSON body `{"score": <finite number>}` (other keys are ignored). Timeouts, failed connections
and 5xx statuses are retried up to `retries` times, waiting `backoff_s`, then twice as long each
time (times a random factor between 0.5 and 1, so that workers do not retry in step); a 4xx
status and an answer without a finite score are not retried. At most `max_concurrency` requests
are in flight at once.

A response that still has no score fails: with `on_failure: "error"` the batch raises
RemoteRewardError naming the url (without its query), the attempts and the last error; with
"zero" it scores 0 and is counted in `reward/remote/failures`. A call takes at most about
`timeout_s × (retries + 1)` plus the backoffs per response (more when responses queue behind
`max_concurrency`).
"""

from __future__ import annotations

import math
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from rl_core.errors import InputError, RLCoreError

FIELD = "reward.remote"
ERROR_BODY_CHARS = 200  # of an error answer shown in the failure reason


class RemoteRewardError(RLCoreError, RuntimeError):
    """The reward service could not score a batch's responses (`on_failure: error`)."""


@dataclass
class Outcome:
    """One response's result: its score, or None and why; attempts made; request seconds."""

    score: float | None
    attempts: int
    error: str | None = None
    latencies: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RemoteBatch:
    """Scores of one batch (failed responses score 0), the failures and retries counted, and
    the seconds of each request made."""

    scores: list[float]
    failures: int
    retries: int
    latencies: list[float]

    def metrics(self, prefix: str = "reward/remote") -> dict[str, float]:
        lat = self.latencies
        return {
            f"{prefix}/latency_mean_s": sum(lat) / len(lat) if lat else 0.0,
            f"{prefix}/latency_max_s": max(lat, default=0.0),
            f"{prefix}/failures": float(self.failures),
            f"{prefix}/retries": float(self.retries),
            f"{prefix}/mean": sum(self.scores) / len(self.scores) if self.scores else 0.0,
        }


class RemoteReward:
    """A client of a reward service (see the module's docstring); thread-safe, its requests
    made by a pool of `max_concurrency` threads started on first use."""

    def __init__(self, url: str, *, token_env: str | None = None, weight: float = 1.0,
                 timeout_s: float = 30.0, retries: int = 3, backoff_s: float = 0.5,
                 max_concurrency: int = 8, on_failure: str = "error") -> None:
        if urlsplit(url).scheme not in ("http", "https"):
            raise InputError(f"{FIELD}.url: {shown_url(url)!r} must start with http:// or "
                             "https://")
        if on_failure not in ("error", "zero"):
            raise InputError(f"{FIELD}.on_failure: {on_failure!r} must be error or zero")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0 or max_concurrency < 1:
            raise InputError(f"{FIELD}: timeout_s must be positive, retries and backoff_s at "
                             "least 0, max_concurrency at least 1")
        self.url, self.token_env, self.weight = url, token_env, float(weight)
        self.timeout_s, self.retries, self.backoff_s = float(timeout_s), int(retries), backoff_s
        self.max_concurrency, self.on_failure = int(max_concurrency), on_failure
        self._pool: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, remote: Any) -> RemoteReward:
        """From a `RemoteRewardConfig` (`spec.reward.remote`) or a mapping of its fields."""
        if isinstance(remote, Mapping):
            return cls(**remote)
        return cls(remote.url, token_env=remote.token_env, weight=remote.weight,
                   timeout_s=remote.timeout_s, retries=remote.retries,
                   backoff_s=remote.backoff_s, max_concurrency=remote.max_concurrency,
                   on_failure=remote.on_failure)

    # ------------------------------------------------------------------ scoring

    def submit(self, prompts: Sequence[str | None] | None, responses: Sequence[str],
               truths: Sequence[Any] | None = None) -> list[Future]:
        """Start scoring every response (at most `max_concurrency` requests at once); one
        future of an `Outcome` each. `collect` turns them into a RemoteBatch."""
        n = len(responses)
        prompts = [None] * n if prompts is None else list(prompts)
        truths = [None] * n if truths is None else list(truths)
        if not len(prompts) == len(truths) == n:
            raise ValueError(f"{n} responses, {len(prompts)} prompts and {len(truths)} ground "
                             "truths: give one of each per response")
        headers = self._headers()
        pool = self._executor()
        return [pool.submit(self._score_one, {"prompt": p, "response": r, "ground_truth": t},
                            headers)
                for p, r, t in zip(prompts, responses, truths)]

    def collect(self, futures: Sequence[Future]) -> RemoteBatch:
        """Wait for `submit`'s futures; RemoteRewardError when one failed and `on_failure` is
        error."""
        outcomes: list[Outcome] = [f.result() for f in futures]
        failed = [o for o in outcomes if o.score is None]
        if failed and self.on_failure == "error":
            last = failed[-1]
            raise RemoteRewardError(
                f"{FIELD}: {len(failed)} of {len(outcomes)} responses could not be scored by "
                f"{shown_url(self.url)} (the last after {last.attempts} attempt(s): "
                f"{last.error}); check the service, or set {FIELD}.on_failure: zero to score "
                "such responses 0")
        return RemoteBatch(
            scores=[0.0 if o.score is None else o.score for o in outcomes],
            failures=len(failed),
            retries=sum(max(0, o.attempts - 1) for o in outcomes),
            latencies=[s for o in outcomes for s in o.latencies],
        )

    def score_batch(self, prompts: Sequence[str | None] | None, responses: Sequence[str],
                    truths: Sequence[Any] | None = None) -> RemoteBatch:
        """Score every response; see `submit` and `collect`."""
        return self.collect(self.submit(prompts, responses, truths))

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.token_env:
            token = os.environ.get(self.token_env, "")
            if not token:
                raise InputError(f"{FIELD}.token_env: the environment variable "
                                 f"{self.token_env} is not set (or empty) where the rewards "
                                 "are scored: set it for the run's workers")
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _score_one(self, payload: dict[str, Any], headers: dict[str, str]) -> Outcome:
        import requests

        session = self._session()
        outcome = Outcome(None, 0)
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.0))
            outcome.attempts += 1
            started = time.monotonic()
            try:
                answer = session.post(self.url, json=payload, headers=headers,
                                      timeout=self.timeout_s)
            except (requests.Timeout, requests.ConnectionError) as error:
                outcome.latencies.append(time.monotonic() - started)
                outcome.error = _request_error(error, self.timeout_s)
                continue
            except (requests.RequestException, TypeError, ValueError) as error:
                outcome.error = f"{type(error).__name__}: {error}"[:500]
                return outcome
            outcome.latencies.append(time.monotonic() - started)
            if answer.status_code >= 500:
                outcome.error = f"HTTP {answer.status_code}: {_body(answer)}"
                continue
            if answer.status_code >= 300:
                outcome.error = (f"HTTP {answer.status_code} (not retried): {_body(answer)}")
                return outcome
            outcome.score, outcome.error = _score_of(answer)
            return outcome
        return outcome

    def _session(self):
        session = getattr(self._local, "session", None)
        if session is None:
            import requests

            session = self._local.session = requests.Session()
        return session

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency,
                                                thread_name_prefix="ascent-remote-reward")
            return self._pool

    def close(self) -> None:
        """Stop the request threads (started again if the client is used again)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RemoteReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shown_url(url: str) -> str:
    """The url without a user name, password, query or fragment (which may hold keys)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))


def _request_error(error: Exception, timeout_s: float) -> str:
    import requests

    if isinstance(error, requests.Timeout):
        return f"no answer within timeout_s={timeout_s:g} s"
    return f"cannot connect ({type(error).__name__})"


def _body(answer: Any) -> str:
    text = " ".join((answer.text or "").split())
    return text[:ERROR_BODY_CHARS] or "(empty body)"


def _score_of(answer: Any) -> tuple[float | None, str | None]:
    """(score, None), or (None, why) for an answer without a finite number at "score"."""
    try:
        body = answer.json()
    except ValueError:
        return None, f"the answer is not JSON: {_body(answer)}"
    if not isinstance(body, Mapping) or "score" not in body:
        return None, f'the answer has no "score": {_body(answer)}'
    value = body["score"]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f'"score" is not a number: {value!r}'[:300]
    if not math.isfinite(value):
        return None, f'"score" is not finite: {value!r}'
    return float(value), None


__all__ = ["RemoteBatch", "RemoteReward", "RemoteRewardError", "shown_url"]
