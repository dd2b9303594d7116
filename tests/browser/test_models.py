"""The model registry's pages in Chromium: the models list, a model's versions, a version's
lineage (data files with their SHA-256 from rl_core.lineage, the parent version, the code), the
links between runs and versions both ways, and moving an alias with the version's form."""

from __future__ import annotations

import hashlib
import json

import pytest
from playwright.sync_api import expect

from experiments.models import Run
from registry.models import ModelAlias, ModelVersion, RegisteredModel, VersionState
from rl_core.lineage import lineage_of
from rl_core.spec import resolve_spec
from tests.browser.conftest import screenshot

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def registry(team, tmp_path):
    """adder v1 from a run on a data file, v2 from a run that started from v1 (with lineage as
    rl_core writes it), and a version still exporting."""
    data = tmp_path / "gsm8k-train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a in range(20) for b in range(20)))
    owner, experiment = team["users"]["owner"], team["experiment"]
    spec = resolve_spec({"algorithm": "grpo", "model": {"path": "tiny:small"},
                         "data": {"train_files": [str(data)]}})
    first = Run.objects.create(experiment=experiment, name="qwen-math-grpo", algorithm="grpo",
                               spec=spec.model_dump(mode="json"), state="SUCCEEDED",
                               created_by=owner, device_type="cpu", device_count=1)
    model = RegisteredModel.objects.create(project=team["project"], name="qwen-math",
                                           description="GRPO on sums", created_by=owner)
    v1 = ModelVersion.objects.create(model=model, run=first, step=200, version=1,
                                     state=VersionState.READY, created_by=owner,
                                     source=f"runs:/{'a' * 32}/exported/step_200",
                                     lineage=lineage_of(spec, "a" * 32))
    ModelAlias.objects.create(model=model, name="champion", version=v1)
    again = spec.model_dump(mode="json")
    again["model"]["path"] = "models:/qwen-math@champion"
    second = Run.objects.create(experiment=experiment, name="qwen-math-dapo", algorithm="dapo",
                                spec=again, state="SUCCEEDED", created_by=owner,
                                device_type="cpu", device_count=1)
    lineage = lineage_of(spec, "b" * 32)
    lineage["model"]["registered"] = {"uri": "models:/qwen-math/1", "name": "qwen-math",
                                      "version": 1, "run_id": "a" * 32}
    v2 = ModelVersion.objects.create(model=model, run=second, step=100, version=2,
                                     state=VersionState.READY, created_by=owner, lineage=lineage,
                                     source=f"runs:/{'b' * 32}/exported/step_100")
    pending = ModelVersion.objects.create(model=model, run=second, step=50, created_by=owner)
    return {"model": model, "v1": v1, "v2": v2, "pending": pending, "data": data,
            "runs": (first, second)}


def test_a_version_shows_its_lineage_and_an_alias_moves_with_its_form(page, sign_in, team,
                                                                       registry):
    model, v1, v2 = registry["model"], registry["v1"], registry["v2"]
    sign_in(team["users"]["maintainer"])
    page.goto("/")
    page.get_by_test_id("nav-models").click()
    row = page.get_by_test_id("model-row-qwen-math")
    expect(row).to_contain_text("v2")
    expect(row).to_contain_text("@champion → v1")
    expect(row).to_contain_text("1 exporting")
    screenshot(page, "models")

    row.get_by_role("link", name="qwen-math").click()
    versions = page.get_by_test_id("versions-table")
    expect(versions).to_contain_text("models:/qwen-math/2")
    expect(page.get_by_test_id(f"version-state-{registry['pending'].pk}")).to_have_text("Exporting")
    screenshot(page, "model")

    page.get_by_test_id(f"version-row-{v2.pk}").get_by_role("link", name="v2").click()
    expect(page.get_by_test_id("version-uri")).to_have_text("model.path: models:/qwen-math/2")
    expect(page.get_by_test_id("version-parent")).to_have_text("qwen-math v1")
    expect(page.get_by_test_id("sha256")).to_have_text(
        hashlib.sha256(registry["data"].read_bytes()).hexdigest())
    expect(page.get_by_test_id("version-code")).to_contain_text("rl_core 0.1.0")
    expect(page.get_by_test_id("version-run")).to_contain_text("qwen-math-dapo")
    screenshot(page, "model-version")

    # The alias moves from v1 to v2 (nothing registered in MLflow changes for a pending one:
    # these versions are rows only, so the form is tried on the pending version's page).
    pending = registry["pending"]
    page.goto(f"/models/{model.pk}/versions/{pending.pk}/")
    page.get_by_test_id("version-aliases").fill("candidate")
    page.get_by_role("button", name="Save").click()
    expect(page.locator(".messages")).to_contain_text("saved")
    assert ModelVersion.objects.get(pk=pending.pk).alias_names() == ["candidate"]
    from audit.models import AuditEntry

    entry = AuditEntry.objects.get(action="model_version.update")
    assert (entry.object_id, entry.actor_name) == (str(pending.pk), "maintainer")

    # The parent's page links to the run; the run's page links back to its versions.
    page.goto(f"/models/{model.pk}/versions/{v1.pk}/")
    expect(page.get_by_test_id("version-parent")).to_have_text("tiny:small")
    page.get_by_test_id("version-run").click()
    expect(page.get_by_test_id("run-model-versions")).to_contain_text("qwen-math v1")
    page.goto(f"/runs/{registry['runs'][1].pk}/")
    expect(page.get_by_test_id("run-started-from")).to_contain_text("models:/qwen-math@champion")
    page.get_by_test_id("run-started-from").get_by_role("link").click()
    expect(page.get_by_test_id("model-name")).to_have_text("qwen-math")

    # The runs list marks the runs a version was made from, linking to it.
    page.goto("/runs/")
    first, second = registry["runs"]
    expect(page.get_by_test_id(f"run-model-{first.pk}")).to_have_text("qwen-math v1")
    expect(page.get_by_test_id(f"run-model-{second.pk}")).to_have_text("qwen-math v2")
    page.get_by_test_id(f"run-model-{second.pk}").click()
    expect(page.get_by_test_id("version-uri")).to_have_text("model.path: models:/qwen-math/2")


def test_a_viewer_sees_versions_without_forms(page, sign_in, team, registry):
    sign_in(team["users"]["viewer"])
    page.goto(f"/models/{registry['model'].pk}/versions/{registry['v1'].pk}/")
    expect(page.get_by_test_id("version-state")).to_have_text("Ready")
    expect(page.get_by_test_id("version-form")).to_have_count(0)
    page.goto(f"/runs/{registry['runs'][0].pk}/")
    expect(page.get_by_test_id("run-model-versions")).to_contain_text("qwen-math v1")
    expect(page.get_by_test_id("register-model")).to_have_count(0)
