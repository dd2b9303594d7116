"""Webhook signatures, the retry schedule and the URLs a webhook may call (pure, no database)."""

from __future__ import annotations

import pytest

from notifications import signing

SECRET = "whsec_test"


def test_a_signature_verifies_and_a_changed_body_or_secret_or_old_one_does_not():
    body = b'{"event": "run.failed"}'
    header = signing.signature(SECRET, 1_750_000_000, body)
    assert header.startswith("t=1750000000,v1=") and len(header.split("v1=")[1]) == 64
    assert signing.verify(SECRET, header, body, now=1_750_000_100)
    assert not signing.verify(SECRET, header, body + b" ", now=1_750_000_100)
    assert not signing.verify("whsec_other", header, body, now=1_750_000_100)
    assert not signing.verify(SECRET, header, body, now=1_750_000_000 + 301)  # replayed later
    assert not signing.verify(SECRET, "v1=abc", body) and not signing.verify(SECRET, "", body)


def test_retries_wait_longer_each_time():
    assert [signing.retry_delay_s(n) for n in range(1, 6)] == [10, 30, 90, 270, 810]
    assert signing.MAX_ATTEMPTS == 6


def resolver(table):
    def resolve(host, port):
        if host not in table:
            raise OSError("Name or service not known")
        return table[host]
    return resolve


@pytest.mark.parametrize("url, addresses, problem", [
    ("https://hooks.example.com/x", ["93.184.216.34"], None),
    ("http://10.0.0.5:8080/hook", ["10.0.0.5"], None),  # a private network is allowed
    ("ftp://hooks.example.com/x", [], "Use an http:// or https:// URL."),
    ("https://user:pw@hooks.example.com/", ["93.184.216.34"], "Leave credentials out"),
    ("http://localhost:9/", ["127.0.0.1", "::1"], "resolves to 127.0.0.1, a loopback"),
    ("http://metadata.internal/", ["169.254.169.254"], "link-local"),
    ("http://[::ffff:127.0.0.1]/", ["::ffff:127.0.0.1"], "loopback"),
    ("http://0.0.0.0/", ["0.0.0.0"], "loopback, link-local or multicast"),
    ("https://nowhere.invalid/", None, "Cannot resolve nowhere.invalid"),
    ("https://hooks.example.com:99999/", ["93.184.216.34"], "port is not a number"),
])
def test_which_urls_a_webhook_may_call(url, addresses, problem):
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname
    table = {} if addresses is None else {host: addresses}
    found = signing.url_problem(url, resolver=resolver(table))
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


def test_an_admin_may_allow_a_local_receiver():
    local = resolver({"127.0.0.1": ["127.0.0.1"]})
    assert "loopback" in signing.url_problem("http://127.0.0.1:8999/h", resolver=local)
    assert signing.url_problem("http://127.0.0.1:8999/h", allow_local=True, resolver=local) is None
