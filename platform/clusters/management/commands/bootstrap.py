"""`python manage.py bootstrap`: prepare a fresh single-machine platform (what `make run` does).

Idempotent. Creates the `admin` superuser with a random password and an API token (both written
once to var/admin-credentials, mode 0600), registers this machine as the cluster `local` with one
CPU node, and prints where everything is served.
"""

import os
import socket

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.utils import timezone
from django.utils.crypto import get_random_string

from accounts.tokens import issue_token
from clusters.choices import DeviceKind, DeviceType, NodeState
from clusters.models import Cluster, Node


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


class Command(BaseCommand):
    help = "Create the admin user and the local cluster if missing; print the URLs."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--ray-address", default="http://127.0.0.1:8265")

    def handle(self, host, port, ray_address, **options):
        credentials = settings.VAR_DIR / "admin-credentials"
        self._admin(credentials)
        self._local_cluster(ray_address)
        base = f"http://{host}:{port}"
        login = (
            f"{credentials}  (user admin: password and API token)"
            if credentials.exists()
            else "admin existed before bootstrap: `manage.py changepassword admin`, "
            "`manage.py createtoken admin`"
        )
        self.stdout.write(
            "\nAscent is starting:\n"
            f"  API          {base}/api/v1/\n"
            f"  API docs     {base}/api/docs/   (OpenAPI: {base}/api/schema/)\n"
            f"  Admin        {base}/admin/\n"
            f"  Credentials  {login}\n"
            f"  Database     {settings.DATABASES['default']['NAME']}\n"
        )

    def _admin(self, credentials) -> None:
        user_model = get_user_model()
        if user_model.objects.filter(username="admin").exists():
            return
        password = get_random_string(24)
        user = user_model.objects.create_superuser("admin", "", password)
        # A year, or the server's maximum token lifetime where that is shorter.
        _, token = issue_token(user, "bootstrap", days=min(365, settings.ASCENT_TOKEN_MAX_DAYS or 365))
        # Created readable by the owner only, before anything secret is written to it.
        fd = os.open(credentials, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(f"username=admin\npassword={password}\ntoken={token}\n")
        self.stdout.write(f"Created superuser admin; password and API token are in {credentials}.")

    def _local_cluster(self, ray_address: str) -> None:
        cluster, created = Cluster.objects.get_or_create(
            name="local",
            defaults={"device_type": DeviceKind.CPU, "ray_address": ray_address,
                      "labels": {"purpose": "single-machine"}},
        )
        cpus = os.cpu_count() or 1
        Node.objects.update_or_create(
            cluster=cluster, hostname=socket.gethostname(),
            defaults={"address": "127.0.0.1", "device_type": DeviceType.CPU, "device_count": cpus,
                      "healthy_device_count": cpus, "cpu_count": cpus,
                      "memory_bytes": _memory_bytes(), "state": NodeState.READY,
                      "last_seen": timezone.now()},
        )
        if created:
            self.stdout.write(f"Registered this machine as cluster 'local' ({cpus} CPU devices).")
