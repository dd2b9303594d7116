"""`python manage.py demo`: submit the demo GRPO run and follow it (what `make run` shows).

Waits for the web server, MLflow and the Ray head to answer, submits a short GRPO run on the
warm start `tiny:small-addition` (experiments.starter: a tiny model after a short SFT, made on
first use) into the project `demo` as the admin user, prints its state changes and where to
look, then stays up: `make run`'s process manager stops everything when any of its
processes ends, so the demo must not.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from accounts.choices import Role
from accounts.models import Membership, Project
from clusters.models import Cluster
from experiments.choices import TERMINAL_STATES
from experiments.models import Experiment, Run
from experiments.services import Submission, submit_run
from experiments.starter import DEMO_NAME, starter_spec

DEMO_SPEC = {**starter_spec("grpo"), "name": DEMO_NAME}


def _digest(spec: dict) -> str:
    """Part of the demo's idempotency key: a repeated `make run` follows the same run, a changed
    demo spec submits a new one."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except OSError as exc:  # an HTTP error status still means the server is up
        return hasattr(exc, "code")


class Command(BaseCommand):
    help = "Submit the demo GRPO run (once) and follow its state."

    def add_arguments(self, parser):
        parser.add_argument("--web", default="http://127.0.0.1:8000")
        parser.add_argument("--ray-dashboard", default="http://127.0.0.1:8265")
        parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for the services")
        parser.add_argument("--exit", action="store_true", help="exit when the run has finished")

    def handle(self, web, ray_dashboard, timeout, exit, **options):
        services = {"web": f"{web}/healthz", "MLflow": f"{settings.MLFLOW_TRACKING_URI}/health",
                    "Ray": f"{ray_dashboard}/api/version"}
        deadline = time.monotonic() + timeout
        for name, url in services.items():
            while not _answers(url):
                if time.monotonic() > deadline:
                    self.stderr.write(f"{name} did not answer at {url} within {timeout:.0f} s")
                    return
                time.sleep(1)
        run = self._submit()
        self.stdout.write(
            "\nAscent is up:\n"
            f"  Web UI       {web}/   (sign in as admin: password in the credentials file)\n"
            f"  API          {web}/api/v1/   (docs: {web}/api/docs/)\n"
            f"  MLflow       {settings.MLFLOW_TRACKING_URI}\n"
            f"  Ray          {ray_dashboard}\n"
            f"  Demo run     {web}/runs/{run.pk}/   (API: {web}/api/v1/runs/{run.pk}/)\n"
            f"  Credentials  {settings.VAR_DIR / 'admin-credentials'}\n")
        self._follow(run, exit)

    def _submit(self) -> Run:
        admin = get_user_model().objects.get(username="admin")
        project, _ = Project.objects.get_or_create(name="demo", defaults={"description": "make run"})
        Membership.objects.get_or_create(project=project, user=admin, defaults={"role": Role.OWNER})
        experiment, _ = Experiment.objects.get_or_create(project=project, name="grpo-tiny",
                                                         defaults={"created_by": admin})
        run, created = submit_run(experiment, admin, Submission(
            spec=DEMO_SPEC, name="demo", cluster=Cluster.objects.filter(name="local").first(),
            idempotency_key=f"make-run-demo-{_digest(DEMO_SPEC)}"))
        self.stdout.write(f"{'Submitted' if created else 'Following'} demo run {run.pk}.")
        return run

    def _follow(self, run: Run, exit: bool) -> None:
        seen = None
        while True:
            run.refresh_from_db()
            if run.state != seen:
                seen = run.state
                detail = f": {run.error}" if run.error else ""
                self.stdout.write(f"demo run {run.pk}: {run.state}{detail}")
                if run.state in TERMINAL_STATES:
                    self.stdout.write(f"metrics: {run.mlflow_run_id and 'in MLflow, run ' + run.mlflow_run_id}")
                    if exit:
                        return
            time.sleep(2)
