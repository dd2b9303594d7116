"""Names are one line of plain text (ascent.validators.plain_text, rl_core.spec's rule): no NUL,
newline, terminal escape or right-to-left override reaches an experiment, a run or a token,
through the API or the web UI, and a refused name is a 400 naming its field."""

from __future__ import annotations

import pytest

from accounts.models import ApiToken
from experiments.models import Experiment, Run

BAD_NAMES = {"nul": "a\x00b", "newline": "two\nlines", "ansi": "\x1b[31mred\x1b[0m",
             "rtl-override": "invoice\u202efdp.exe", "isolate": "a\u2066b"}
pytestmark = pytest.mark.parametrize("bad", BAD_NAMES.values(), ids=list(BAD_NAMES))


def fields_of(response) -> set[str]:
    assert response.status_code == 400, response.content[:300]
    return {error["field"] for error in response.json()["errors"]}


def test_an_experiment_name(clients, signed_in, project, bad):
    api = clients["owner"].post("/api/v1/experiments/", {"project": project.pk, "name": bad},
                                format="json")
    assert fields_of(api) == {"name"}
    page = signed_in("owner").post(f"/settings/projects/{project.pk}/experiments/", {"name": bad})
    assert page.status_code == 400
    assert not Experiment.objects.filter(project=project).exclude(name="baseline").exists()


def test_a_token_name(clients, login, users, bad):
    before = ApiToken.objects.count()  # the clients' own tokens
    assert fields_of(clients["owner"].post("/api/v1/tokens/", {"name": bad}, format="json")) == {"name"}
    page = login("owner").post("/settings/tokens/", {"name": bad, "expires_in_days": "30"})
    assert any(word in page.content.decode() for word in ("U+", "NUL"))  # the refusal, shown
    assert ApiToken.objects.count() == before


def test_a_run_name_in_the_request_and_in_the_spec(submit, experiment, bad):
    assert fields_of(submit(name=bad)) == {"name"}
    assert fields_of(submit(spec={"algorithm": "grpo", "data": {"synthetic": {"task": "addition"}},
                                  "name": bad})) == {"spec.name"}
    assert not Run.objects.filter(experiment=experiment).exists()
