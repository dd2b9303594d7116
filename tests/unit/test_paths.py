"""The path policy of a cluster (rl_core.paths): pure checks, and the job refusing a spec."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Annotated, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

from rl_core.errors import InputError
from rl_core.paths import (PATH_FIELDS, POLICY_ENV, PathPolicy, check_paths, normalize_root,
                            path_problem)
from rl_core.spec import RunSpec, resolve_spec

ROOT = Path(__file__).resolve().parents[2]
POLICY = PathPolicy("npu-a", model_roots=("/models", "/shared/models"), data_roots=("/data",),
                    output_roots=("/runs",), allow_trust_remote_code=False)
# Path-like by name but not a path (none today); a new path field must go into PATH_FIELDS.
NOT_PATHS: set[str] = set()
PATH_NAME = re.compile(r"(path|paths|files|file|dir|output|model|folder|root)$")


def spec(**sections) -> dict:
    base = {"data": {"synthetic": {"task": "addition"}}}
    return {**base, **sections}


def fields(errors) -> list[str]:
    return [e["field"] for e in errors]


def test_it_allows_paths_inside_the_roots():
    s = spec(model={"path": "/models/qwen", "tokenizer_path": "/shared/models/tok"},
             data={"train_files": ["/data/a.jsonl"], "val_files": ["/data/b/c.parquet"]},
             trainer={"output_dir": "/runs/run-1"})
    assert check_paths(resolve_spec(s), POLICY) == []


def test_it_refuses_a_path_outside_naming_the_field_and_the_roots():
    errors = check_paths(spec(model={"path": "/etc/x"}), POLICY)
    assert errors == [{"field": "model.path", "message": "model.path /etc/x is outside the model "
                       "roots of cluster npu-a (/models, /shared/models)"}]


def test_it_refuses_a_dotdot_escape_and_a_sibling_with_the_same_prefix():
    s = spec(model={"path": "/models/../etc/passwd"}, data={"train_files": ["/data2/a.jsonl"]})
    errors = check_paths(s, POLICY)
    assert fields(errors) == ["model.path", "data.train_files.0"]
    assert "(that is /etc/passwd)" in errors[0]["message"]


def test_it_refuses_a_symlink_escape_at_the_job(tmp_path):
    models, secret = tmp_path / "models", tmp_path / "secret"
    models.mkdir(), secret.mkdir()
    (models / "link").symlink_to(secret)
    policy = PathPolicy("c", model_roots=(str(models),))
    s = spec(model={"path": str(models / "link" / "weights")})
    assert check_paths(s, policy) == []  # at submit the folder is not there to look at
    errors = check_paths(s, policy, resolve=True)
    assert fields(errors) == ["model.path"] and str(secret) in errors[0]["message"]


def test_a_root_that_is_itself_a_link_still_allows_its_contents_at_the_job(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "models").symlink_to(real)
    policy = PathPolicy("c", model_roots=(str(tmp_path / "models"),))
    assert check_paths(spec(model={"path": str(tmp_path / "models" / "m")}), policy,
                       resolve=True) == []


def test_tiny_models_are_always_allowed():
    assert check_paths(spec(model={"path": "tiny:small"}), POLICY) == []
    assert check_paths(spec(model={"path": "tiny:small-addition"}), PathPolicy("local")) == []


def test_a_tiny_name_that_is_no_preset_is_refused_naming_the_presets():
    with pytest.raises(InputError, match=r"model.path.*unknown tiny model '\.\./\.\./etc'.*tiny:nano"):
        resolve_spec(spec(model={"path": "tiny:../../etc"}))
    # As a path (how the policy sees any other text) it is relative, under any policy.
    for policy in (POLICY, PathPolicy("local")):
        errors = path_problem("model.path", "model", "tiny:../../etc", policy)
        assert errors and "relative path" in errors


def test_empty_roots_mean_no_restriction_on_absolute_paths_but_relative_ones_are_refused():
    s = spec(model={"path": "/anywhere/m"}, data={"train_files": ["/data/a.jsonl"]},
             trainer={"output_dir": "/outputs"})
    assert check_paths(s, PathPolicy("local")) == []
    relative = spec(model={"path": "/anywhere/m"}, data={"train_files": ["rel.jsonl"]},
                    trainer={"output_dir": "/outputs"})
    errors = check_paths(relative, PathPolicy("local"))
    assert fields(errors) == ["data.train_files.0"]
    assert "give an absolute path on the cluster" in errors[0]["message"]
    assert PathPolicy("local").unrestricted and not POLICY.unrestricted


def test_trust_remote_code_is_refused_unless_allowed():
    s = spec(model={"path": "/models/m", "trust_remote_code": True})
    errors = check_paths(s, POLICY)
    assert fields(errors) == ["model.trust_remote_code"]
    assert "model.trust_remote_code=false" in errors[0]["message"]
    allowing = PathPolicy("c", model_roots=("/models",), allow_trust_remote_code=True)
    assert check_paths(s, allowing) == []


def test_relative_paths_are_refused_where_roots_are_set():
    s = spec(model={"path": "models/m"}, data={"train_files": ["~/a.jsonl"]})
    errors = check_paths(s, POLICY)
    assert fields(errors) == ["model.path", "data.train_files.0"]
    assert all("relative path" in e["message"] for e in errors)


def test_tool_folders_are_checked_under_the_output_dir():
    s = spec(trainer={"output_dir": "/runs/r"}, tools={"profiling": {"output": "../../etc"},
                                                       "precision": {"output": "/tmp/dump"}})
    assert fields(check_paths(s, POLICY)) == ["tools.profiling.output", "tools.precision.output"]
    ok = spec(trainer={"output_dir": "/runs/r"})  # profiles/, precision/ under it by default
    assert check_paths(ok, POLICY) == []


def test_every_path_field_is_checked_when_set_outside():
    s = spec(model={"path": "/x/m", "tokenizer_path": "/x/t"},
             critic={"model_path": "/x/c"}, reward={"reward_model": "/x/r"},
             data={"train_files": ["/x/a"], "val_files": ["/x/b"]},
             trainer={"output_dir": "/x/o", "resume_path": "/x/ckpt", "resume_mode": "resume_path"},
             tools={"profiling": {"output": "/x/p"}, "precision": {"output": "/x/q"}})
    got = {f.removesuffix(".0") for f in fields(check_paths(s, POLICY))}
    assert got == set(PATH_FIELDS)


def _str_fields(model: type[BaseModel], prefix: str = ""):
    """Dotted names of the text (or list of text) fields of `model`, recursively."""
    for name, info in model.model_fields.items():
        tp = info.annotation
        if get_origin(tp) in (Union, types.UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        if get_origin(tp) is Annotated:  # e.g. rl_core.spec.ModelLocation
            tp = get_args(tp)[0]
        if get_origin(tp) is list:
            tp = get_args(tp)[0]
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            yield from _str_fields(tp, f"{prefix}{name}.")
        elif tp is str:
            yield f"{prefix}{name}"


def test_every_path_like_field_of_the_spec_is_known_to_the_checker():
    path_like = {f for f in _str_fields(RunSpec) if PATH_NAME.search(f.rsplit(".", 1)[-1])}
    assert path_like, "the walk found no fields"
    unknown = path_like - set(PATH_FIELDS) - NOT_PATHS
    assert not unknown, f"add these to rl_core.paths.PATH_FIELDS (or NOT_PATHS): {unknown}"
    assert set(PATH_FIELDS) <= set(_str_fields(RunSpec)), "a checked field left the spec"


@pytest.mark.parametrize(("root", "words"), [("models", "absolute"), ("/a/../b", "'..'"),
                                              ("", "not a path")])
def test_a_bad_root_is_refused(root, words):
    with pytest.raises(ValueError, match=words):
        normalize_root(root)


def test_roots_are_normalized_and_the_policy_travels_as_json():
    assert normalize_root("/models/./a/") == "/models/a" and normalize_root("//m") == "/m"
    assert PathPolicy.from_json(POLICY.to_json()) == POLICY


# --------------------------------------------------------------------------- at the job


def rl_core(*args: str, cwd: Path, policy: PathPolicy | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    env.pop(POLICY_ENV, None)
    if policy is not None:
        env[POLICY_ENV] = policy.to_json()
    return subprocess.run([sys.executable, "-m", "rl_core", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _write_spec(tmp_path: Path, **sections) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec(**sections)))
    return str(path)


@pytest.mark.parametrize("command", ["train", "sft"])
def test_the_job_exits_2_naming_the_field_before_loading_anything(tmp_path, command):
    spec_file = _write_spec(tmp_path, model={"path": "/etc/ascent-no-such-model"},
                            trainer={"output_dir": "/runs/run-1"})
    result = rl_core(command, spec_file, cwd=tmp_path, policy=POLICY)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: invalid input: path policy: model.path /etc/ascent-no-such-"
                           "model is outside the model roots of cluster npu-a"), last
    assert "no such folder" not in result.stderr  # refused before the model was looked at


def test_eval_checks_its_checkpoint_and_data(tmp_path):
    result = rl_core("eval", "/etc/ckpt", "/etc/data.jsonl", cwd=tmp_path, policy=POLICY)
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "checkpoint /etc/ckpt is outside the model roots" in last
    assert "data /etc/data.jsonl is outside the data roots" in last


def test_a_malformed_policy_variable_is_an_input_error(tmp_path):
    spec_file = _write_spec(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), POLICY_ENV: "{not json"}
    result = subprocess.run([sys.executable, "-m", "rl_core", "train", spec_file], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and POLICY_ENV in result.stderr.splitlines()[-1]


# --------------------------------------------------------------------------- placement


def _queued(id, count=1, allowed=None, priority=0):
    from experiments.placement import QueuedRun

    return QueuedRun(id, priority, 0.0, "npu", count, None, allowed)


def test_placement_skips_clusters_whose_policy_refuses_the_run():
    from experiments.placement import place

    free = {"npu-a": {"npu": 8}, "npu-b": {"npu": 1}}
    placements, _ = place([_queued(1, allowed=frozenset({"npu-a"})), _queued(2)], free, now=0.0)
    assert [(p.run_id, p.cluster) for p in placements] == [(1, "npu-a"), (2, "npu-b")]


def test_placement_says_why_a_run_no_allowed_cluster_fits_waits():
    from experiments.placement import place

    free = {"npu-a": {"npu": 1}, "npu-b": {"npu": 8}}
    total = {"npu-a": {"npu": 2}, "npu-b": {"npu": 8}}
    queue = [_queued(1, count=4, allowed=frozenset({"npu-a"})),
             _queued(2, count=1, allowed=frozenset()),
             _queued(3, count=2, allowed=frozenset({"npu-a"}))]
    placements, waiting = place(queue, free, now=0.0, total=total)
    assert placements == []
    assert {w.run_id: w.reason for w in waiting} == {
        1: "needs 4 npu devices; largest cluster its path policy allows: 2 healthy (npu-a)",
        2: "no cluster whose path policy allows this run has npu devices",
        3: "needs 2 npu devices; largest free on a cluster its path policy allows: 1 (npu-a)",
    }
    placements, waiting = place(queue, free, now=0.0)  # without reservation: the same reasons
    assert waiting[0].reason.startswith("needs 4 npu devices; largest free on a cluster its")


def test_the_job_follows_symbolic_links_out_of_a_root(tmp_path):
    models, secret = tmp_path / "models", tmp_path / "secret"
    models.mkdir(), secret.mkdir()
    (models / "link").symlink_to(secret)
    policy = PathPolicy("c", model_roots=(str(models),))
    spec_file = _write_spec(tmp_path, model={"path": str(models / "link" / "m")})
    result = rl_core("sft", spec_file, cwd=tmp_path, policy=policy)
    assert result.returncode == 2, result.stderr
    assert f"(that is {secret / 'm'}) is outside the model roots" in result.stderr
