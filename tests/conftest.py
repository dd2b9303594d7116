"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import sys

import pytest

# Real services for the end-to-end tests (Ray head, MLflow server, Celery worker).
pytest_plugins = ["tests.stack"]

# Every Ray the tests start (the local Ray, the Ray head, one a run starts for itself) runs its
# workers at the tests' own priority. Ray's default niceness of 15 for workers lets any other
# process that computes starve a run's ranks: beside two busy cores a two-rank test took 591 s
# instead of 21, and beside the other test tier they waited on each other's collectives.
os.environ.setdefault("RAY_worker_niceness", "0")


# Cache keys of the API's rate limits: DRF throttles and failed bearer tokens per address.
RATE_LIMIT_KEYS = ("throttle_*", "token-failures:*")


@pytest.fixture(autouse=True)
def _fresh_rate_limits():
    """Every test starts with no API request or failed token counted, so tests cannot throttle
    each other. (Sign-in lockouts are rows of django-axes in the test database, which is emptied
    between tests.)"""
    from django.core.cache import cache

    if type(cache).__name__ != "RedisCache":
        cache.clear()
        return
    client = cache._cache.get_client(write=True)
    for pattern in RATE_LIMIT_KEYS:
        keys = list(client.scan_iter(match=cache.make_key(pattern)))
        if keys:
            client.delete(*keys)


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray instance for the session: tests start and stop roles on it; trainers join
    it (rl_core.roles.cluster.connect) instead of starting their own."""
    ray = pytest.importorskip("ray")
    # Workers import what the tests define (roles in test modules) from the test folders.
    path = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()
