"""Admission (rl_core.admission): the one call the API, the web UI and the command line use to
decide whether a resolved spec can run where it would go."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rl_core import memory_plan as mp
from rl_core.admission import Facts, admit, built_in_models, launched, memory_verdict
from rl_core.paths import POLICY_ENV, PathPolicy
from rl_core.spec import resolve_spec

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30
LOCKED = PathPolicy("locked", model_roots=("/models",), data_roots=("/data",),
                    output_roots=("/runs",))
OPEN = PathPolicy("open")


def spec(**sections):
    """A valid spec whose output folders are inside LOCKED's roots (a relative path is refused
    by every policy: the job would resolve it in a temporary folder)."""
    raw = {"data": {"synthetic": {"task": "addition"}}, "trainer": {"output_dir": "/runs/me"},
           "tools": {"profiling": {"output": "/runs/me/p"}, "precision": {"output": "/runs/me/d"}}}
    for name, section in sections.items():
        raw[name] = {**raw.get(name, {}), **section}
    return resolve_spec(raw)


def fields(admission) -> list[str]:
    return [r["field"] for r in admission.refusals]


def test_a_spec_alone_is_admitted_with_its_memory_verdict():
    admission = admit(spec())

    assert admission.admitted and admission.refusals == ()
    assert admission.memory.plan is not None and admission.memory.reason == ""
    assert admission.memory.plan.fits is None  # a CPU run: no device memory to compare with


def test_unknown_reward_names_and_wrong_kwargs_are_refused_at_their_index():
    admission = admit(spec(reward={"functions": [
        {"name": "exact_match"}, {"name": "no_such_reward"},
        {"name": "exact_match", "kwargs": {"bogus": 1}}]}))

    assert fields(admission) == ["reward.functions.1.name", "reward.functions.2.kwargs"]
    assert "no_such_reward" in admission.refusals[0]["message"]
    assert "exact_match" in admission.refusals[0]["message"]  # the valid names are listed
    assert "bogus" in admission.refusals[1]["message"]


def test_unknown_tools_and_wrong_tool_kwargs_are_refused_at_their_index():
    admission = admit(spec(rollout={"multi_turn": {"tools": [
        {"name": "calculator"}, {"name": "web_search"}, {"name": "python", "kwargs": {"x": 1}}]}}))

    assert fields(admission) == ["rollout.multi_turn.tools.1.name",
                                 "rollout.multi_turn.tools.2.kwargs"]
    assert "web_search" in admission.refusals[0]["message"]
    assert "calculator, python" in admission.refusals[0]["message"]  # the valid names
    assert "does not take ['x']" in admission.refusals[1]["message"]


def test_a_named_cluster_refuses_its_paths_with_the_launchers_output_note():
    s = spec(model={"path": "/elsewhere/qwen"}, trainer={"output_dir": "/tmp/mine"})
    facts = Facts(policies=(LOCKED,), cluster="locked", output_dir="/var/ascent/runs",
                  output_note=" (note)")

    admission = admit(s, facts)

    refused = {r["field"]: r["message"] for r in admission.refusals}
    assert list(refused) == ["model.path", "trainer.output_dir"]
    assert refused["trainer.output_dir"].endswith(" (note)")
    assert "/var/ascent/runs" in refused["trainer.output_dir"]  # the launcher's folder
    assert not refused["model.path"].endswith(" (note)")


def test_without_a_named_cluster_a_path_is_refused_only_when_every_cluster_refuses_it():
    s = spec(model={"path": "/elsewhere/qwen"})

    assert admit(s, Facts(policies=(LOCKED, OPEN))).admitted
    other = PathPolicy("other", model_roots=("/shared",))
    admission = admit(s, Facts(policies=(LOCKED, other)))
    assert fields(admission) == ["model.path"]
    message = admission.refusals[0]["message"]
    assert message.startswith("no cluster offering cpu devices (locked, other) allows this path")
    assert "/models" in message and "/shared" in message


def test_the_launcher_drops_the_resume_path_and_owns_the_output_folder():
    s = spec(trainer={"output_dir": "/tmp/mine", "resume_path": "/tmp/mine/step-4",
                      "resume_mode": "resume_path"})

    assert launched(s, None)["trainer"]["resume_path"] == "/tmp/mine/step-4"
    data = launched(s, "/runs")
    assert data["trainer"]["output_dir"] == "/runs" and "resume_path" not in data["trainer"]


def test_host_memory_is_refused_only_when_every_known_node_is_smaller():
    s = spec(resources={"memory_gb": 64})
    small = ((32 * GIB, "a/n1"), (48 * GIB, "a/n2"))

    admission = admit(s, Facts(nodes=small, cluster="a"))
    assert fields(admission) == ["resources.memory_gb"]
    assert "of cluster a" in admission.refusals[0]["message"]
    assert "a/n2, has 48.0 GiB" in admission.refusals[0]["message"]
    assert "with cpu devices" in admit(s, Facts(nodes=small)).refusals[0]["message"]
    assert admit(s, Facts(nodes=(*small, (0, "a/unknown")))).admitted  # one unknown: no verdict
    assert admit(s, Facts(nodes=(*small, (64 * GIB, "a/n3")))).admitted


def test_every_refusal_comes_back_at_once():
    s = spec(reward={"functions": [{"name": "nope"}]}, model={"path": "/elsewhere/qwen"},
             resources={"memory_gb": 64})

    admission = admit(s, Facts(policies=(LOCKED,), cluster="locked", nodes=((GIB, "n"),)))

    assert fields(admission) == ["reward.functions.0.name", "resources.memory_gb", "model.path"]


def test_the_memory_plan_uses_the_device_model_or_the_given_memory():
    s = spec(resources={"device_type": "gpu"}, rollout={"engine": "vllm"})

    h100 = memory_verdict(s, Facts(device_model="nvidia-h100", device_cluster="c"))
    assert h100.plan.device_memory_bytes == 80 * GIB
    assert h100.to_dict()["device_model"] == "nvidia-h100"
    assert h100.to_dict()["device_cluster"] == "c"
    # vLLM takes gpu_memory_utilization of the device it knows, less its weights, for its cache
    cache = {c.name: c.bytes for c in h100.plan.components}["vLLM KV cache"]
    assert cache == int(0.5 * 80 * GIB) - h100.plan.parameters * h100.plan.setup.dtype_bytes
    # the same figure as the command line's plan for that device
    assert h100.plan.to_dict() == mp.plan(s, mp.shape_of(s), 80 * GIB).to_dict()

    assert memory_verdict(s, Facts(device_memory_bytes=2**20)).does_not_fit
    unknown = memory_verdict(s)  # a GPU of no known model: no verdict
    assert unknown.plan.fits is None and not unknown.does_not_fit


def test_a_model_whose_shape_is_unknown_here_has_no_plan_and_is_not_refused():
    admission = admit(spec(model={"path": "/on/the/cluster/only"}))

    assert admission.admitted
    assert admission.memory.plan is None and admission.memory.to_dict() is None
    assert admission.memory.reason.startswith("no memory plan: model.path: cannot read")


def test_the_built_in_models_are_the_warm_starts_a_spec_accepts():
    models = built_in_models()

    assert "tiny:small-addition" in models and models["tiny:small-addition"]
    for name in models:
        assert spec(model={"path": name}).model.path == name


def test_here_takes_the_policy_the_platform_hands_a_job():
    assert Facts.here(environ={}) == Facts()
    facts = Facts.here(environ={POLICY_ENV: LOCKED.to_json()}, device_memory_bytes=GIB)
    assert facts.policies == (LOCKED,) and facts.cluster == "locked"
    assert facts.device_memory_bytes == GIB


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "rl_core", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)


def test_spec_validate_refuses_what_the_platform_would(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps({"data": {"synthetic": {"task": "addition"}},
                                "trainer": {"output_dir": "/runs/me"},
                                "reward": {"functions": [{"name": "no_such_reward"}]},
                                "model": {"path": "/elsewhere/qwen"}}))
    env = {**os.environ, POLICY_ENV: LOCKED.to_json()}

    result = run_cli("spec", "validate", str(path), env=env)

    assert result.returncode == 2, result.stderr
    assert "reward.functions.0.name" in result.stderr and "no_such_reward" in result.stderr
    assert "model.path" in result.stderr and "/models" in result.stderr
    assert result.stdout == ""
