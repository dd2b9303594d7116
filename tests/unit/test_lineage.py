"""`models:/` paths (parsed, refused, exempt from the path policy, needing a registry) and a run's
lineage (data files with their SHA-256, the parent model's origin, the code's commit)."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest

from rl_core.errors import InputError
from rl_core.lineage import code_version, file_facts, lineage_of, model_facts
from rl_core.models.registry import (REGISTERED_FILE, RegistryRef, fetch_registered,
                                     parse_registry_uri)
from rl_core.paths import PathPolicy, check_paths
from rl_core.recipes.warm import with_model_folders
from rl_core.spec import SpecError, resolve_spec


@pytest.mark.parametrize(("text", "ref"), [
    ("models:/adder/3", RegistryRef("adder", 3)),
    ("models:/qwen2.5-math_v2/12", RegistryRef("qwen2.5-math_v2", 12)),
    ("models:/adder@champion", RegistryRef("adder", alias="champion")),
    ("/models/adder", None),
    ("tiny:small", None),
])
def test_a_registry_path_is_parsed(text, ref):
    assert parse_registry_uri(text) == ref
    if ref is not None:
        assert ref.uri == text


@pytest.mark.parametrize("text", ["models:/adder", "models:/adder/0", "models:/adder/x",
                                  "models:/adder@", "models:/a/1/2", "models:/-a/1",
                                  "models:/adder@9lives"])
def test_a_malformed_registry_path_is_refused_with_both_forms(text):
    with pytest.raises(ValueError, match=r"models:/<name>/<version> .* or models:/<name>@<alias>"):
        parse_registry_uri(text)
    with pytest.raises(SpecError, match="model.path"):
        resolve_spec({"data": {"synthetic": {}}, "model": {"path": text}})


def test_no_path_root_applies_to_a_registered_model():
    spec = resolve_spec({"data": {"synthetic": {}}, "model": {"path": "models:/adder@champion"},
                         "trainer": {"output_dir": "/out/run"}})
    policy = PathPolicy(cluster="c", model_roots=("/models",), output_roots=("/out",))
    assert check_paths(spec, policy) == []
    other = spec.model_copy(update={"model": spec.model.model_copy(update={"path": "/tmp/m"})})
    assert [e["field"] for e in check_paths(other, policy)] == ["model.path"]


def test_a_registered_model_needs_the_registrys_address(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    with pytest.raises(InputError, match="set MLFLOW_TRACKING_URI"):
        fetch_registered("models:/adder/1")
    spec = resolve_spec({"data": {"synthetic": {}}, "model": {"path": "models:/adder/1"}})
    with pytest.raises(InputError, match="models:/adder/1"):
        with_model_folders(spec)


def test_the_lineage_hashes_each_data_file_and_names_the_parent_version(tmp_path):
    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    train.write_text('{"prompt": "1+1=", "answer": "2"}\n' * 1000)
    val.write_text('{"prompt": "2+2=", "answer": "4"}\n')
    parent = tmp_path / "parent"
    parent.mkdir()
    origin = {"uri": "models:/adder/2", "name": "adder", "version": 2, "run_id": "r1"}
    (parent / REGISTERED_FILE).write_text(json.dumps(origin))
    spec = resolve_spec({"data": {"train_files": [str(train)], "val_files": [str(val)]},
                         "model": {"path": str(parent)}})

    lineage = lineage_of(spec, "mlflow-run")

    assert lineage["data"]["files"] == [
        {"split": "train", "path": str(train), "bytes": train.stat().st_size,
         "sha256": hashlib.sha256(train.read_bytes()).hexdigest()},
        {"split": "val", "path": str(val), "bytes": val.stat().st_size,
         "sha256": hashlib.sha256(val.read_bytes()).hexdigest()}]
    assert lineage["model"] == {"path": str(parent), "registered": origin, "warm_start": None}
    assert lineage["run"]["mlflow_run_id"] == "mlflow-run" and lineage["data"]["synthetic"] is None
    assert lineage["spec"]["data"]["train_files"] == [str(train)]
    json.dumps(lineage)  # stored as JSON as it is


def test_a_big_file_is_hashed_in_pieces(tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * 20_000)  # 5 MB: several reads
    assert file_facts(big)["sha256"] == hashlib.sha256(big.read_bytes()).hexdigest()


def test_a_built_in_model_has_no_origin_and_the_code_names_its_commit(monkeypatch):
    assert model_facts("tiny:small") == {"path": "tiny:small", "registered": None,
                                         "warm_start": None}
    monkeypatch.setenv("ASCENT_CODE_VERSION", "image-2026.12.1")
    assert code_version()["commit"] == "image-2026.12.1"
    monkeypatch.delenv("ASCENT_CODE_VERSION")
    commit = code_version()["commit"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    if head:  # a git checkout (CI's is one)
        assert commit.removesuffix("+changes") == head.strip()
