"""`trainer.deterministic`: two runs of a GRPO spec, locally (the tiny example) and on two sharded
Ray ranks (the golden run), log bitwise-identical metrics and precision dumps (`tools.precision`,
which compare as "no divergence"), and each stores a report of what every process set."""

from __future__ import annotations

import json
from pathlib import Path

from golden_runs import STEPS, comparable, golden_run_spec
from test_trainer import read_metrics, tiny_spec

from rl_core.determinism import DETERMINISTIC_ENV
from rl_core.precision import compare
from rl_core.recipes import run
from rl_core.recipes.rl import RLTrainer
from rl_core.spec import resolve_spec


def deterministic_run(out: Path) -> list[dict]:
    """The tiny GRPO example in process, deterministic, with precision dumps of step 2."""
    spec = resolve_spec(tiny_spec(
        out, trainer={"total_steps": 2, "deterministic": True},
        tools={"precision": {"enable": True, "steps": [2], "ranks": [0]}}))
    RLTrainer(spec, backend="local").fit()
    return comparable(read_metrics(out))


def report(out: Path) -> dict:
    return json.loads((out / "determinism" / "report.json").read_text())


def assert_same_dumps(a: Path, b: Path, workers: set[str]) -> None:
    """Byte-identical dump files of step 2 in both runs, from each of `workers` (but the call
    stacks, `stack.json`, which hold the caller's line); `compare` finds no divergence and has
    compared every module and data tensor."""
    files = sorted(p.relative_to(a) for p in (a / "precision").rglob("*")
                   if p.is_file() and p.name != "stack.json")
    assert {f.parts[2] for f in files} == workers
    assert any(f.name == "dump.json" for f in files) and any(f.name == "data.safetensors"
                                                              for f in files)
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    made = compare(a / "precision", b / "precision")
    assert not made.diverged and made.first_divergence is None, made.summary()
    assert "no divergence" in made.summary()
    assert made.count("only_in_a") == made.count("only_in_b") == 0
    assert len(made.rows) > 50


def test_two_local_runs_are_bitwise_identical_and_say_what_was_set(tmp_path, tiny_cache):
    first = deterministic_run(tmp_path / "a")
    second = deterministic_run(tmp_path / "b")
    assert len(first) == 2 and first == second  # floats compared exactly
    assert_same_dumps(tmp_path / "a", tmp_path / "b",
                      {"controller-rank0", "actor-rank0", "reference-rank0"})
    made = report(tmp_path / "a")
    assert made["deterministic"] and made["consistent"], made["problems"]
    assert {p["role"] for p in made["processes"]} == {"controller", "actor", "reference",
                                                      "reward"}
    for process in made["processes"]:
        assert process["seed"] == 7 and process["deterministic_algorithms"]
        assert {k: v["value"] for k, v in process["env"].items()} == {
            k: v for k, (v, _) in DETERMINISTIC_ENV.items()}


def test_two_runs_on_two_ray_ranks_are_bitwise_identical(tmp_path, sft_base, ray_run):
    """The golden GRPO run on two sharded, deterministic Ray ranks (test_golden.py's, with
    precision dumps of step 2 on both ranks; made once per session) and the same spec again."""
    first, again = ray_run.folder("grpo"), tmp_path / "again"
    run(resolve_spec(golden_run_spec("grpo", sft_base, again, 2)), backend="ray")
    second = comparable(read_metrics(again))
    assert second[-1]["step"] == STEPS and ray_run("grpo") == second  # floats compared exactly
    assert_same_dumps(first, again, {
        "controller-rank0", "actor-rank0", "actor-rank1", "reference-rank0", "reference-rank1"})
    made = report(first)
    assert made["deterministic"] and made["consistent"], made["problems"]
    actors = [p for p in made["processes"] if p["role"] == "actor"]
    assert sorted(p["rank"] for p in actors) == [0, 1]
    assert len({p["pid"] for p in made["processes"]}) == len(made["processes"])  # own processes
    # the variables were in each rank's environment from its start (the Ray placement's)
    assert all(p["env"]["HCCL_DETERMINISTIC"]["value"] == "true" for p in actors)


def test_a_run_that_is_not_deterministic_reports_so(tmp_path, tiny_cache):
    out = tmp_path / "run"
    RLTrainer(resolve_spec(tiny_spec(out, trainer={"total_steps": 1}))).fit()
    made = report(out)
    assert not made["deterministic"] and made["consistent"]
    assert not any(p["deterministic_algorithms"] for p in made["processes"])
