"""rl_core on a real local Ray: two data-parallel ranks equal one, every algorithm learns (DPO on
two ranks), DPO raises its preference accuracy, and a dead or failing role ends the run at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from faulty_role import Faulty
from learning import LEARNING_DATA, learning_spec, rose, validation_gain
from safetensors.torch import load_file
from test_trainer import read_metrics, tiny_spec

from rl_core.data.synthetic import synthetic_splits
from rl_core.errors import InputError
from rl_core.recipes.dpo import DPOTrainer
from rl_core.recipes.rl import RLTrainer
from rl_core.roles import RayGroup, RoleFailed
from rl_core.roles.cluster import check_resources
from rl_core.spec import resolve_spec
from rl_core.tracking import stable_metrics

ROOT = Path(__file__).resolve().parents[2]


def overlong_dapo(output_dir: Path, devices: int, steps: int = 3) -> dict:
    """DAPO without dynamic sampling on a random model: the overlong penalty makes the rewards
    of a group differ, so every step has real gradients (exact match is 0 for this model)."""
    return tiny_spec(output_dir, algorithm="dapo", reference={"enable": False},
                     actor={"use_kl_loss": False},
                     advantage={"overlong_buffer": {"enable": True, "len": 2, "penalty_factor": 1.0},
                                "dynamic_sampling": {"enable": False}},
                     resources={"devices_per_node": devices}, trainer={"total_steps": steps})


def final_weights(output_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(output_dir / "checkpoints" / f"step_{step}" / "model.safetensors")


def test_two_ranks_on_ray_equal_one_rank_in_process(tmp_path, tiny_cache, local_ray):
    RLTrainer(resolve_spec(overlong_dapo(tmp_path / "one", 1))).fit()
    RLTrainer(resolve_spec(overlong_dapo(tmp_path / "two", 2)), backend="ray").fit()

    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [m["step"] for m in one] == [m["step"] for m in two] == [1, 2, 3]
    assert any(m["actor/grad_norm"] > 0 for m in one), "the comparison needs real updates"
    for left, right in zip(one, two):
        right = {k: v for k, v in stable_metrics(right).items() if not k.startswith("channel/")}
        left = {k: v for k, v in stable_metrics(left).items() if not k.startswith("channel/")}
        assert left == pytest.approx(right, rel=1e-4, abs=1e-6), left["step"]
    a, b = final_weights(tmp_path / "one", 3), final_weights(tmp_path / "two", 3)
    for name, value in a.items():
        assert torch.allclose(value, b[name], atol=1e-5), name


# the two ranks' layout: the spec's sections -> each actor rank's place
LAYOUTS = {
    "ulysses": ({"parallel": {"context_parallel_size": 2}}, (1, 2, 1, 1, 2, 1)),
    "ring": ({"parallel": {"context_parallel_size": 2, "context_parallel_algo": "ring"}},
             (1, 2, 1, 1, 2, 1)),
    "tensor": ({"parallel": {"tensor_parallel_size": 2}, "actor": {"strategy": "fsdp2"}},
               (1, 1, 2, 1, 1, 2)),
    # training data-parallel over both ranks, generating together as one rollout group
    "rollout-group": ({"rollout": {"tensor_parallel_size": 2}, "actor": {"strategy": "fsdp2"}},
                      (2, 1, 1, 2, 1, 1)),
    # four ranks: the model's matrices split over pairs, each sequence's tokens over the pairs
    "tensor-and-context": ({"parallel": {"tensor_parallel_size": 2, "context_parallel_size": 2},
                            "actor": {"strategy": "fsdp2"}}, (1, 2, 2, 1, 2, 2)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_model_parallel_ranks_on_ray_equal_one_rank_in_process(tmp_path, tiny_cache,
                                                                   local_ray, layout):
    """GRPO with the reference, old log-probs and two passes: the ranks hold every row and
    split its packed tokens (context parallelism) or the model's matrices (tensor
    parallelism), or both over four ranks, or split the rows and generate together as one
    rollout group, so the run is one rank's."""
    sections, place = LAYOUTS[layout]

    def spec(out: Path, devices: int, **extra) -> dict:
        actor = {"use_remove_padding": True, **extra.pop("actor", {})}
        return tiny_spec(out, resources={"devices_per_node": devices}, trainer={"total_steps": 2},
                         actor=actor, **extra)

    devices = place[1] * place[2] * max(place[0], place[3])  # every rank of the layout
    RLTrainer(resolve_spec(spec(tmp_path / "one", 1))).fit()
    trainer = RLTrainer(resolve_spec(spec(tmp_path / "two", devices, **sections)), backend="ray")
    names = ("data_parallel", "context_parallel", "tensor_parallel", "rollout_parallel",
             "engine_context_parallel", "engine_tensor_parallel")
    assert [tuple(r[n] for n in names)
            for r in trainer.roles.actor.call("layout")] == [place] * devices
    reference = place[:3] + (1,) + place[4:]  # the reference does not roll out
    assert [tuple(r[n] for n in names)
            for r in trainer.roles.reference.call("layout")] == [reference] * devices
    trainer.fit()
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [m["step"] for m in one] == [m["step"] for m in two] == [1, 2]
    assert any(m["actor/grad_norm"] > 0 for m in one), "the comparison needs real updates"
    assert all("actor/kl_loss" in m for m in two)  # the reference ran on the group's shares
    for left, right in zip(one, two):
        right = {k: v for k, v in stable_metrics(right).items() if not k.startswith("channel/")}
        left = {k: v for k, v in stable_metrics(left).items() if not k.startswith("channel/")}
        # actor/ppo_kl is itself of the order of rounding (old and new log-probs of the same
        # weights, about 3e-6): split matrices sum in another order, so it may differ by 1e-6
        assert left == pytest.approx(right, rel=1e-4, abs=3e-6), left["step"]


def test_a_rollout_pool_of_its_own_equals_one_colocated_rank(tmp_path, tiny_cache, local_ray):
    """Two devices train and a third only generates (`parallel.colocate_actor_rollout:
    false`): the pool starts from the actor's weights and takes them over the link after every
    update (both actor ranks gather each bucket, rank 0 sends it), so the run is one colocated
    rank's, step for step."""
    def spec(out: Path, devices: int, **extra) -> dict:
        # a large step, so the second rollout from stale weights would sample other tokens; no
        # reference (fewer processes), the entropy bonus gives the update a gradient anyway
        return tiny_spec(out, resources={"devices_per_node": devices},
                         actor={"lr": 0.05, "lr_scheduler": "constant", "use_kl_loss": False,
                                "entropy_coeff": 0.01}, reference={"enable": False},
                         trainer={"total_steps": 2, "eval_every": 2}, **extra)

    RLTrainer(resolve_spec(spec(tmp_path / "one", 1))).fit()
    trainer = RLTrainer(resolve_spec(spec(tmp_path / "two", 3, parallel={
        "colocate_actor_rollout": False, "rollout_devices": 1})), backend="ray")
    assert (trainer.roles.actor.size, trainer.roles.rollout.size) == (2, 1)
    trainer.fit()
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [m["step"] for m in one] == [m["step"] for m in two] == [0, 1, 2]
    assert any(m.get("actor/grad_norm", 0) > 0 for m in one), "the comparison needs updates"
    for m in two[1:]:  # the update ended with the weights sent and received
        assert m["rollout/weight_sync_bytes"] > 0 and m["timing/weight_receive"] > 0
    for left, right in zip(one, two):
        right = {k: v for k, v in stable_metrics(right).items()
                 if not k.startswith(("channel/", "rollout/weight_"))}
        left = {k: v for k, v in stable_metrics(left).items() if not k.startswith("channel/")}
        assert left == pytest.approx(right, rel=1e-4, abs=1e-6), left["step"]


# GRPO and PPO on two deterministic Ray ranks equal one rank in process (test_golden.py), so
# what they learn on one they learn on two; DPO's pairs from the policy's own answers are made
# on two ranks here only.
@pytest.mark.parametrize(("algorithm", "devices"), [("grpo", 1), ("ppo", 1), ("dpo", 2)])
def test_each_algorithm_learns(algorithm, devices, tmp_path, sft_base, request):
    sections = {"resources": {"devices_per_node": devices}}
    if devices > 1:
        request.getfixturevalue("local_ray")
    if algorithm == "ppo":  # GAE over one response per... four responses, a learned critic
        sections.update(rollout={"n_samples_per_prompt": 4},
                        actor={"ppo_mini_batch_size": 8, "ppo_epochs": 2, "ppo_micro_batch_size": 16},
                        critic={"enable": True, "lr": 1e-3, "ppo_micro_batch_size": 16})
    if algorithm == "dpo":  # pairs from the policy's own answers: chosen right, rejected wrong
        sections.update(actor={"lr": 5e-5})
    out = tmp_path / algorithm
    spec = resolve_spec(learning_spec(algorithm, sft_base, out, 10, **sections))
    trainer_class = DPOTrainer if algorithm == "dpo" else RLTrainer
    trainer_class(spec, backend="ray" if devices > 1 else "local").fit()
    before, after = validation_gain(out)
    assert 0.0 < before < 0.9, f"the SFT base should be right only part of the time, got {before}"
    assert rose(before, after), f"{algorithm}: validation accuracy did not rise: {before} -> {after}"
    logged = read_metrics(out)
    assert all(f"channel/wait_s/{s}" in logged[1] for s in ("reward",) if algorithm != "dpo")
    if algorithm == "ppo":
        assert {"critic/vf_loss", "critic/values/mean", "timing/values"} <= set(logged[1])
    assert (out / "checkpoints" / "step_10" / "model.safetensors").is_file()


def test_dpo_on_fixed_pairs_raises_preference_accuracy_and_margins(tmp_path, sft_base):
    # the SFT base's training problems (LEARNING_DATA with the base's seed, 1)
    records, _ = synthetic_splits(seed=1, **LEARNING_DATA["synthetic"])
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(
        json.dumps({"prompt": r["prompt"], "good": str(r["answer"]),
                    "bad": str(int(r["answer"]) + 1)}) + "\n" for r in records))
    out = tmp_path / "dpo"
    spec = learning_spec("dpo", sft_base, out, 15, actor={"lr": 1e-4, "ppo_epochs": 1},
                         trainer={"eval_every": 0})
    spec["data"] = {"train_files": [str(pairs)], "chosen_key": "good", "rejected_key": "bad",
                    "prompt_template": "plain", "train_batch_size": 16}
    DPOTrainer(resolve_spec(spec)).fit()
    logged = read_metrics(out)
    # Step 1 measures the policy before any update, equal to the reference: every implicit reward
    # is 0 (margins 0, loss log 2) and its "accuracy" only counts rounding noise. After 15 steps
    # the policy prefers the right answer well above chance (0.5).
    first, last = logged[0], logged[-3:]

    def mean(rows, key):
        return sum(m[key] for m in rows) / len(rows)

    assert abs(first["dpo/rewards/margins"]) < 1e-3
    assert mean(last, "dpo/rewards/accuracies") >= 0.8
    assert mean(last, "dpo/rewards/margins") > first["dpo/rewards/margins"] + 0.05
    assert mean(last, "dpo/loss") < first["dpo/loss"] - 0.02


# --------------------------------------------------------------------------- faults


def test_a_killed_rank_ends_the_run_with_the_role_name_and_releases_its_resources(
        tmp_path, tiny_cache, local_ray):
    from ray.util import placement_group_table

    trainer = RLTrainer(resolve_spec(overlong_dapo(tmp_path, 2, steps=4)), backend="ray")
    trainer.train_step()
    pid = trainer.roles.actor.call("ping")[1]
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(RoleFailed, match=r"role actor \(rank 1\) failed: its process died"):
        trainer.fit()
    assert time.monotonic() - started < 120
    states = {g["state"] for g in placement_group_table().values()}
    assert "CREATED" not in states, "the run's placement group must be removed"


def test_an_exception_inside_a_role_names_the_role_and_input_errors_keep_their_type(local_ray):
    group = RayGroup.start("faulty", Faulty, size=2, options=[{"num_cpus": 0}] * 2)
    try:
        with pytest.raises(RoleFailed, match=r"role faulty \(rank [01]\) failed: ZeroDivisionError: "
                                             r"the fault under test"):
            group.call("explode")
        with pytest.raises(InputError, match="data.train_files: no such file"):
            group.call("bad_input")
        assert group.call("wait", 0.0) == [0, 1]
    finally:
        group.shutdown()


def test_too_few_devices_fail_before_any_role_starts(tmp_path, tiny_cache, local_ray):
    spec = resolve_spec(overlong_dapo(tmp_path, 2) | {"resources": {"device_type": "gpu",
                                                                     "devices_per_node": 2}})
    with pytest.raises(InputError, match=r"asks for GPU 2, CPU 2 .* the Ray cluster has CPU 4, GPU 0"):
        RLTrainer(spec, backend="ray")
    npu = overlong_dapo(tmp_path, 1) | {"resources": {"device_type": "npu", "num_nodes": 2,
                                                      "devices_per_node": 2}}
    npu["actor"]["ppo_micro_batch_size"] = 2
    with pytest.raises(InputError, match=r"asks for NPU 4, CPU 4 \(2 node\(s\) x 2 npu"):
        check_resources(resolve_spec(npu), {"CPU": 64, "NPU": 2})
    check_resources(resolve_spec(npu), {"CPU": 64, "NPU": 4})  # enough: no error


# --------------------------------------------------------------------------- the command


def test_the_train_command_joins_the_ray_cluster_of_ray_address(tmp_path, tiny_cache, local_ray):
    spec_file = tmp_path / "spec.yaml"
    # one rank: joining is the same for any number (two ranks on Ray are tested above)
    spec_file.write_text(yaml.safe_dump(overlong_dapo(tmp_path / "out", 1, steps=2)))
    address = local_ray.get_runtime_context().gcs_address
    result = subprocess.run(
        [sys.executable, "-m", "rl_core", "train", str(spec_file)], cwd=ROOT,
        env={**os.environ, "RAY_ADDRESS": address}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"joined the Ray cluster at {address}" in result.stderr
    assert [m["step"] for m in read_metrics(tmp_path / "out")] == [1, 2]
