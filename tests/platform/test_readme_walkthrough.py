"""The README's curl walk-through works exactly as written, against a real server.

The server runs on the embedded defaults (its own SQLite file under a temporary ASCENT_VAR_DIR,
no DATABASE_URL or REDIS_URL), prepared the way `make run` prepares it: migrate, bootstrap,
runserver. The bash blocks between the walk-through markers of README.md are run, concatenated,
in one `bash -euo pipefail` from the repository root; only the port of `export ASCENT=` changes.
No test database is used, so this test does not request the `db` fixture.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from embedded_server import ROOT, embedded_env, manage, runserver
README = ROOT / "README.md"
START, END = "<!-- walkthrough:start -->", "<!-- walkthrough:end -->"
ASCENT_LINE = re.compile(r"^export ASCENT=http://127\.0\.0\.1:8000$", re.MULTILINE)
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"


def walkthrough_script(port: int) -> str:
    text = README.read_text()
    assert text.count(START) == 1 and text.count(END) == 1, "README.md lacks the walk-through markers"
    section = text[text.index(START) + len(START):text.index(END)]
    blocks = re.findall(r"^```bash\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert blocks, "no bash blocks between the walk-through markers"
    script = "\n".join(blocks)
    assert len(ASCENT_LINE.findall(script)) == 1, "expected one `export ASCENT=http://127.0.0.1:8000`"
    return ASCENT_LINE.sub(f"export ASCENT=http://127.0.0.1:{port}", script)


@pytest.fixture
def served(tmp_path):
    """A runserver on the embedded defaults, as `make run` starts it; yields (port, env)."""
    if not VENV_PYTHON.exists():
        pytest.skip("the README's commands use .venv/bin/python: create it with `make install`")
    env = embedded_env(tmp_path / "var")
    manage(env, "migrate", "--noinput")
    manage(env, "bootstrap", "--host", "127.0.0.1")
    with runserver(env, tmp_path / "server.log") as base:
        yield int(base.rsplit(":", 1)[1]), env


def test_the_readme_walkthrough_runs_as_written(served, tmp_path):
    assert shutil.which("curl"), "the walk-through needs curl"
    port, env = served
    script = walkthrough_script(port)
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    out = result.stdout
    server_log = (tmp_path / "server.log").read_text()
    context = f"\n--- output ---\n{out}\n--- server log ---\n{server_log}"
    assert result.returncode == 0, f"exit {result.returncode}{context}"

    # The token works and belongs to alice.
    assert '"username":"alice"' in out, context
    # The dry run shows the override, the device request and the local cluster of `make run`.
    assert '"valid": true' in out, context
    assert '"rollout.n_samples_per_prompt": 8' in out, context
    assert '"device_type": "cpu"' in out and '"name": "local"' in out, context
    # The invalid spec: a 400 naming each field path, with the typo's suggestion.
    assert "HTTP 400" in out, context
    assert '"field":"spec.actor.lr"' in out, context
    assert '"field":"spec.rollout.n_sample_per_prompt"' in out, context
    assert "did you mean 'n_samples_per_prompt'?" in out, context
    # Submit, then the retry with the same Idempotency-Key: the same run, 200.
    submitted = re.search(r"^run (\d+)$", out, re.MULTILINE)
    assert submitted, context
    run_id = int(submitted.group(1))
    assert "retry: HTTP 200" in out, context
    # The filtered list holds exactly that run, QUEUED, on a cursor page.
    pages = [line for line in out.splitlines() if line.startswith('{"next":')]
    assert len(pages) == 1, f"expected one cursor page of runs{context}"
    page = json.loads(pages[0])
    assert [(r["id"], r["state"]) for r in page["results"]] == [(run_id, "QUEUED")], context
    assert "count" not in page, "runs use cursor pagination"
    # Cancelled at once; a second cancel is a 409 conflict.
    assert re.search(rf"^{run_id} CANCELLED \d{{4}}-", out, re.MULTILINE), context
    assert '"error":"conflict"' in out and "HTTP 409" in out, context
    # The events, oldest first: submitted into QUEUED, then QUEUED -> CANCELLED.
    assert "\n[\n" in out, context
    events, _ = json.JSONDecoder().raw_decode(out[out.rindex("\n[\n") + 1:])
    transitions = [(e["from_state"], e["to_state"]) for e in events]
    assert transitions == [("", "QUEUED"), ("QUEUED", "CANCELLED")], context
    assert {e["actor"] for e in events} == {"alice"}, context
