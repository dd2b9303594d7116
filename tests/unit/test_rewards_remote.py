"""The remote reward against a real HTTP service in a thread: answers, retries, refusals,
hangs, the concurrency limit, the bearer token, and its place in the composer and the spec."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rl_core.errors import InputError
from rl_core.rewards import RewardComposer
from rl_core.rewards.remote import RemoteReward, RemoteRewardError, shown_url
from rl_core.spec import SpecError, resolve_spec

TOKEN_ENV = "ASCENT_TEST_REWARD_TOKEN"


class Service:
    """What the handler saw: requests per path, bodies, headers, the peak of concurrent ones."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hits: Counter[str] = Counter()
        self.bodies: list[dict] = []
        self.auth: list[str | None] = []
        self.active = self.peak = 0
        self.release = threading.Event()


class Handler(BaseHTTPRequestHandler):
    service: Service

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        service = self.server.service  # type: ignore[attr-defined]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        path = self.path.split("?")[0]
        with service.lock:
            service.hits[path] += 1
            hits = service.hits[path]
            service.bodies.append(body)
            service.auth.append(self.headers.get("Authorization"))
            service.active += 1
            service.peak = max(service.peak, service.active)
        try:
            self.answer(path, body, hits, service)
        finally:
            with service.lock:
                service.active -= 1

    def answer(self, path: str, body: dict, hits: int, service: Service) -> None:
        if path == "/score":
            self.reply(200, {"score": float(len(body["response"])), "detail": "length"})
        elif path == "/flaky":  # every other request fails with 503
            if hits % 2:
                self.reply(503, {"error": "busy"})
            else:
                self.reply(200, {"score": 1.0})
        elif path == "/bad":
            self.reply(400, {"error": "no such task"})
        elif path == "/nan":
            self.reply(200, {"score": float("nan")})
        elif path == "/noscore":
            self.reply(200, {"value": 1})
        elif path == "/hang":
            service.release.wait(30)
            self.reply(200, {"score": 1.0})
        elif path == "/slow":
            time.sleep(0.1)
            self.reply(200, {"score": 0.5})
        else:
            self.reply(404, {})

    def reply(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client gave up (a timeout)
            pass


@pytest.fixture
def service():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.service = Service()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.service.base = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore
    yield server.service  # type: ignore[attr-defined]
    server.service.release.set()  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()
    thread.join(10)


def client(service, path: str, **kwargs) -> RemoteReward:
    kwargs.setdefault("backoff_s", 0.01)
    kwargs.setdefault("timeout_s", 5)
    return RemoteReward(service.base + path, **kwargs)


def test_the_service_scores_each_response_with_its_prompt_and_truth(service):
    with client(service, "/score") as remote:
        batch = remote.score_batch(["p1", "p2"], ["abc", "de"], [{"k": 1}, None])
    assert batch.scores == [3.0, 2.0] and (batch.failures, batch.retries) == (0, 0)
    assert sorted(service.bodies, key=lambda b: b["prompt"]) == [
        {"prompt": "p1", "response": "abc", "ground_truth": {"k": 1}},
        {"prompt": "p2", "response": "de", "ground_truth": None}]
    metrics = batch.metrics()
    assert metrics["reward/remote/mean"] == 2.5 and metrics["reward/remote/failures"] == 0
    assert 0 < metrics["reward/remote/latency_mean_s"] <= metrics["reward/remote/latency_max_s"]
    assert set(metrics) == {f"reward/remote/{k}" for k in
                            ("latency_mean_s", "latency_max_s", "failures", "retries", "mean")}


def test_without_prompts_the_prompt_is_null(service):
    with client(service, "/score") as remote:
        remote.score_batch(None, ["x"])
    assert service.bodies == [{"prompt": None, "response": "x", "ground_truth": None}]


def test_a_5xx_answer_is_retried(service):
    with client(service, "/flaky", retries=3) as remote:
        batch = remote.score_batch(None, ["a"])
    assert batch.scores == [1.0] and batch.retries == 1 and service.hits["/flaky"] == 2


def test_a_4xx_answer_is_not_retried(service):
    with client(service, "/bad", retries=3) as remote, pytest.raises(RemoteRewardError) as caught:
        remote.score_batch(None, ["a"])
    assert service.hits["/bad"] == 1
    message = str(caught.value)
    assert f"{service.base}/bad" in message and "1 attempt(s)" in message
    assert "HTTP 400" in message and "no such task" in message and "on_failure: zero" in message


@pytest.mark.parametrize("path, says", [("/nan", "not finite"), ("/noscore", 'no "score"')])
def test_an_answer_without_a_finite_score_fails_with_the_reason(service, path, says):
    with client(service, path) as remote, pytest.raises(RemoteRewardError, match=says):
        remote.score_batch(None, ["a"])
    assert service.hits[path] == 1


def test_a_hanging_service_times_out_retries_and_fails_in_bounded_time(service):
    remote = client(service, "/hang", timeout_s=0.3, retries=2, backoff_s=0.05)
    started = time.monotonic()
    with remote, pytest.raises(RemoteRewardError) as caught:
        remote.score_batch(None, ["a"])
    elapsed = time.monotonic() - started
    assert service.hits["/hang"] == 3
    assert "3 attempt(s)" in str(caught.value)
    assert "no answer within timeout_s=0.3 s" in str(caught.value)
    assert elapsed < 0.3 * 3 + 0.05 * 3 + 10  # about timeout × attempts + backoff; generous


def test_a_service_that_is_down_fails_naming_the_connection(service):
    remote = RemoteReward("http://127.0.0.1:9/score", retries=1, backoff_s=0.01, timeout_s=2)
    with remote, pytest.raises(RemoteRewardError, match="cannot connect"):
        remote.score_batch(None, ["a"])


def test_on_failure_zero_scores_failed_responses_zero_and_counts_them(service):
    with client(service, "/bad", on_failure="zero") as remote:
        batch = remote.score_batch(None, ["a", "b"])
    assert batch.scores == [0.0, 0.0] and batch.failures == 2
    assert batch.metrics()["reward/remote/failures"] == 2.0


def test_requests_in_flight_are_limited_by_max_concurrency(service):
    with client(service, "/slow", max_concurrency=3) as remote:
        batch = remote.score_batch(None, [str(i) for i in range(12)])
    assert batch.scores == [0.5] * 12 and service.hits["/slow"] == 12
    assert 1 <= service.peak <= 3


def test_the_bearer_token_is_sent_and_never_shown(service, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "s3cret-value")
    with client(service, "/score", token_env=TOKEN_ENV) as remote:
        remote.score_batch(None, ["a"])
    assert service.auth == ["Bearer s3cret-value"]
    with client(service, "/bad", token_env=TOKEN_ENV) as remote:
        with pytest.raises(RemoteRewardError) as caught:
            remote.score_batch(None, ["a"])
    assert "s3cret" not in str(caught.value)


def test_a_missing_token_variable_is_an_input_error_naming_it(service, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with client(service, "/score", token_env=TOKEN_ENV) as remote:
        with pytest.raises(InputError, match=f"token_env.*{TOKEN_ENV} is not set"):
            remote.score_batch(None, ["a"])
    assert service.hits["/score"] == 0


def test_messages_show_the_url_without_its_secrets():
    assert shown_url("https://u:p@host:8443/score?key=abc#x") == "https://host:8443/score"


# --------------------------------------------------------------------------- the composer


def test_the_composer_adds_the_weighted_remote_score(service):
    remote = {"url": service.base + "/score", "weight": 0.5, "backoff_s": 0.01}
    with RewardComposer(["exact_match"], remote=remote) as composer:
        assert composer.names == ["exact_match", "remote"]
        scores = composer.score_batch(["abcd", "x"], ["abcd", "y"], prompts=["p", "q"])
    assert scores.per_function == {"exact_match": [1.0, 0.0], "remote": [4.0, 1.0]}
    assert scores.total == [1.0 + 0.5 * 4.0, 0.5 * 1.0]
    metrics = scores.metrics()
    assert metrics["reward/remote/mean"] == 2.5 and metrics["reward/remote/failures"] == 0.0
    assert metrics["reward/exact_match/mean"] == 0.5
    assert {b["prompt"] for b in service.bodies} == {"p", "q"}


def test_the_composer_from_the_spec_and_with_the_remote_reward_alone(service):
    spec = resolve_spec({"data": {"synthetic": {"task": "addition"}}, "reward": {
        "functions": [{"name": "format", "weight": 0}],
        "remote": {"url": service.base + "/flaky", "on_failure": "zero", "retries": 0}}})
    with RewardComposer.from_config(spec.reward) as composer:
        scores = composer.score_batch(["a", "b"], ["1", "2"])
    assert sorted(scores.per_function["remote"]) == [0.0, 1.0]
    assert composer.remote_failures == 1 and scores.remote["failures"] == 1.0
    with RewardComposer([], remote={"url": service.base + "/score"}) as alone:
        assert alone.score_batch(["abc"]).total == [3.0]
    with pytest.raises(ValueError, match="no reward functions"):
        RewardComposer([])


def test_a_failing_service_stops_the_composer_with_the_reason(service):
    with RewardComposer(["exact_match"], remote={"url": service.base + "/bad"}) as composer:
        with pytest.raises(RemoteRewardError, match="HTTP 400"):
            composer.score_batch(["a"], ["a"])


# --------------------------------------------------------------------------- the spec

BASE = {"data": {"synthetic": {"task": "addition"}}}


def spec_with(remote: dict, **reward):
    return resolve_spec({**BASE, "reward": {"remote": remote, **reward}})


@pytest.mark.parametrize("remote, field, says", [
    ({"url": "ftp://rewards.example.com/score"}, "reward.remote.url", "http or https"),
    ({"url": "rewards.example.com/score"}, "reward.remote.url", "http or https"),
    ({"url": "https:///score"}, "reward.remote.url", "names no host"),
    ({"url": "https://user:pw@rewards.example.com"}, "reward.remote.url", "token_env"),
    ({"url": "https://rewards.example.com/a b"}, "reward.remote.url", "white space"),
    ({"url": "https://x.example.com", "token_env": "1TOKEN"}, "reward.remote.token_env",
     "not an environment variable name"),
    ({"url": "https://x.example.com", "token_env": "MY-TOKEN"}, "reward.remote.token_env",
     "not an environment variable name"),
    ({"url": "https://x.example.com", "on_failure": "skip"}, "reward.remote.on_failure", ""),
    ({"url": "https://x.example.com", "max_concurrency": 0}, "reward.remote.max_concurrency", ""),
    ({"token_env": "TOKEN"}, "reward.remote.url", ""),
])
def test_bad_remote_fields_are_refused_at_the_field(remote, field, says):
    with pytest.raises(SpecError) as caught:
        spec_with(remote)
    message = str(caught.value)
    assert field in message and says in message


def test_a_valid_remote_section_keeps_its_values():
    remote = spec_with({"url": "https://rewards.example.com/score", "token_env": "REWARD_TOKEN",
                        "weight": 2, "on_failure": "zero"}).reward.remote
    assert (remote.url, remote.token_env, remote.weight, remote.retries, remote.max_concurrency,
            remote.on_failure) == ("https://rewards.example.com/score", "REWARD_TOKEN", 2.0,
                                   3, 8, "zero")


def test_the_remote_reward_alone_is_a_reward():
    alone = spec_with({"url": "https://x.example.com"}, functions=[])
    assert alone.reward.functions == [] and alone.reward.remote.url == "https://x.example.com"
    with pytest.raises(SpecError, match="reward.functions.*needs a reward"):
        spec_with(None, functions=[])
