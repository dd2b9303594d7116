"""Personas and helpers for the platform tests (real PostgreSQL, real HTTP stack through DRF)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from accounts.choices import Role
from accounts.models import ApiToken, Membership, Project
from clusters.models import Cluster, Node
from experiments.models import Experiment

PERSONAS = ("owner", "maintainer", "viewer", "stranger", "admin", "anonymous")



@pytest.fixture
def tiny_spec() -> dict:
    """The smallest valid submission: the GRPO preset on a synthetic task."""
    return {"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}}}


@pytest.fixture(scope="session", autouse=True)
def _require_postgres(django_db_setup, django_db_blocker):
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.exit(
            "The platform tests run on PostgreSQL: use `make test`, or set DATABASE_URL to a "
            "postgres:// URL.", returncode=3,
        )


@pytest.fixture
def users(db):
    model = get_user_model()
    made = {name: model.objects.create_user(name) for name in PERSONAS[:4]}
    made["admin"] = model.objects.create_user("admin", is_staff=True)
    return made


@pytest.fixture
def project(users):
    project = Project.objects.create(name="alpha", description="the alpha team")
    for name, role in (("owner", Role.OWNER), ("maintainer", Role.MAINTAINER), ("viewer", Role.VIEWER)):
        Membership.objects.create(project=project, user=users[name], role=role)
    return project


@pytest.fixture
def experiment(project, users):
    return Experiment.objects.create(project=project, name="baseline", created_by=users["owner"])


@pytest.fixture
def cluster(db):
    cluster = Cluster.objects.create(name="npu-a", device_type="npu", ray_address="http://head:8265")
    Node.objects.create(cluster=cluster, hostname="n1", device_type="ascend-910b", device_count=8,
                        healthy_device_count=8, cpu_count=192)
    return cluster


@pytest.fixture
def login(users):
    """A fresh web UI client signed in as a persona: `login("owner")`."""
    def login(name: str) -> Client:
        client = Client()
        client.force_login(users[name])
        return client

    return login


@pytest.fixture
def signed_in(client, users):
    """pytest-django's `client`, signed in as a persona: `signed_in("owner")`."""
    def sign_in(name):
        client.force_login(users[name])
        return client
    return sign_in


def client_for(user) -> APIClient:
    """An API client that authenticates the way pipelines do: with a real bearer token."""
    client = APIClient()
    if user is not None:
        _, raw = ApiToken.issue(user, "test")
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def clients(users):
    made = {name: client_for(user) for name, user in users.items()}
    made["anonymous"] = client_for(None)
    return made


@pytest.fixture
def submit(clients, experiment, tiny_spec):
    def _submit(as_="owner", spec=None, **extra):
        body = {"experiment": experiment.pk, "spec": tiny_spec if spec is None else spec, **extra}
        return clients[as_].post("/api/v1/runs/", body, format="json")

    return _submit
