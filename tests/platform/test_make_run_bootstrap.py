"""What `make run` does before serving — migrate, then bootstrap — is safe to repeat.

Run twice against a fresh SQLite file under a temporary ASCENT_VAR_DIR (the embedded defaults,
no DATABASE_URL), it creates the admin user, its credentials file and the `local` cluster once,
and the token in that file authenticates against the served API. No test database is used, so
this test does not request the `db` fixture.
"""

from __future__ import annotations

import json
import socket
import stat
import urllib.error
import urllib.request

from embedded_server import embedded_env, free_port, manage, runserver

INVENTORY = """
import json, os
from django.contrib.auth import get_user_model
from accounts.models import ApiToken
from clusters.models import Cluster
cluster = Cluster.objects.get(name="local")
print(json.dumps({
    "clusters": Cluster.objects.count(),
    "device_type": cluster.device_type,
    "nodes": [
        {"hostname": n.hostname, "device_type": n.device_type, "device_count": n.device_count,
         "healthy": n.healthy_device_count, "state": n.state}
        for n in cluster.nodes.all()
    ],
    "admins": list(get_user_model().objects.filter(username="admin")
                   .values_list("is_superuser", "is_staff")),
    "admin_tokens": ApiToken.objects.filter(user__username="admin").count(),
    "cpus": os.cpu_count(),
}))
"""


def get(url: str, token: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_migrate_and_bootstrap_twice_make_one_admin_and_one_local_cluster(tmp_path):
    var = tmp_path / "var"
    env = embedded_env(var)
    credentials = var / "admin-credentials"
    port = free_port()

    manage(env, "migrate", "--noinput")
    first = manage(env, "bootstrap", "--port", str(port))
    assert (var / "ascent.sqlite3").is_file(), "the embedded default database is var/ascent.sqlite3"
    assert "Created superuser admin" in first.stdout
    assert "Registered this machine as cluster 'local'" in first.stdout
    assert f"http://127.0.0.1:{port}/api/v1/" in first.stdout
    assert str(credentials) in first.stdout

    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600
    written = credentials.read_text()
    fields = dict(line.split("=", 1) for line in written.splitlines())
    assert fields.keys() == {"username", "password", "token"}
    assert fields["username"] == "admin" and len(fields["password"]) >= 20
    assert fields["token"].startswith("asc_")
    assert fields["token"] not in first.stdout + first.stderr, "the token is only in the file"
    assert fields["password"] not in first.stdout + first.stderr, "the password is only in the file"

    manage(env, "migrate", "--noinput")
    second = manage(env, "bootstrap", "--port", str(port))
    assert "Created superuser" not in second.stdout
    assert "Registered this machine" not in second.stdout
    assert "Ascent is starting" in second.stdout
    assert credentials.read_text() == written, "the credentials are written once"
    assert stat.S_IMODE(credentials.stat().st_mode) == 0o600

    shell = manage(env, "shell", "-c", INVENTORY)
    inventory = json.loads(shell.stdout.strip().splitlines()[-1])
    assert inventory["clusters"] == 1 and inventory["device_type"] == "cpu"
    assert inventory["nodes"] == [{
        "hostname": socket.gethostname(), "device_type": "cpu", "device_count": inventory["cpus"],
        "healthy": inventory["cpus"], "state": "ready",
    }]
    assert inventory["admins"] == [[True, True]]
    assert inventory["admin_tokens"] == 1

    # The token in the credentials file authenticates against the served API.
    with runserver(env, tmp_path / "server.log") as base:
        status, me = get(f"{base}/api/v1/me/", fields["token"])
        assert status == 200, me
        assert me["username"] == "admin" and me["is_staff"] is True
        status, clusters = get(f"{base}/api/v1/clusters/?search=local", fields["token"])
        assert status == 200, clusters
        [local] = clusters["results"]
        assert local["node_count"] == 1
        assert local["capacity"]["cpu"]["free"] == inventory["cpus"]
        status, error = get(f"{base}/api/v1/me/", "asc_not-a-token")
        assert (status, error["error"]) == (401, "not_authenticated")
