"""`actor.strategy: fsdp2` through the recipes: on two Ray ranks it equals the plain engine on one
(the recorded golden runs), the rollout's weights equal the trained ones after every sync, and a
checkpoint saved on two ranks resumes on one."""

from __future__ import annotations

import json

import pytest
import torch
from test_golden import GOLDEN, _comparable, golden_spec
from test_trainer import read_metrics

from rl_core.recipes import run
from rl_core.recipes.rl import RLTrainer
from rl_core.spec import resolve_spec


def fsdp_spec(algorithm: str, base, out, devices: int, **trainer) -> dict:
    spec = golden_spec(algorithm, base, out, devices)
    spec["actor"] = {**spec.get("actor", {}), "strategy": "fsdp2"}
    spec["trainer"] = {**spec["trainer"], **trainer}
    return spec


@pytest.mark.parametrize("algorithm", ["grpo", "dpo"])
def test_two_sharded_ranks_equal_the_plain_engine_on_one(algorithm, tmp_path, sft_base, local_ray):
    out = tmp_path / "run"
    run(resolve_spec(fsdp_spec(algorithm, sft_base, out, 2)), backend="ray")
    logged = _comparable(read_metrics(out))
    plain = json.loads((GOLDEN / f"{algorithm}-1rank.json").read_text())
    assert [r["step"] for r in logged] == [r["step"] for r in plain]
    assert any(r.get("actor/grad_norm", 0) > 0 for r in plain)
    for got, want in zip(logged, plain):
        assert sorted(got) == sorted(want), got["step"]
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6), got["step"]


def test_the_rollout_holds_the_trained_weights_after_every_update(tmp_path, sft_base):
    trainer = RLTrainer(resolve_spec(fsdp_spec("grpo", sft_base, tmp_path / "run", 1)))
    try:
        actor = trainer.roles.actor.workers[0]
        for _ in range(2):
            metrics = trainer.train_step()
            trained = actor.engine.full_state_dict()
            rollout = actor.rollout.model.state_dict()
            assert sorted(trained) == sorted(rollout)
            for name, value in trained.items():
                assert torch.equal(value, rollout[name]), name
            assert metrics["timing/weight_sync"] > 0
        assert actor.rollout.model is not actor.engine.model  # the shards are a copy
    finally:
        trainer.close()


def test_a_checkpoint_of_two_ranks_resumes_on_one(tmp_path, sft_base, local_ray):
    straight, out = tmp_path / "straight", tmp_path / "run"
    run(resolve_spec(fsdp_spec("grpo", sft_base, straight, 1)), backend="local")
    interrupted = RLTrainer(resolve_spec(fsdp_spec("grpo", sft_base, out, 2)), backend="ray")
    for _ in range(2):
        interrupted.train_step()
        interrupted.step += 1
    interrupted.save()  # sharded optimizer state gathered in full; then the run "dies"
    interrupted.close()
    resumed = RLTrainer(resolve_spec(fsdp_spec("grpo", sft_base, out, 1)))  # resume_mode auto
    assert resumed.step == 2
    resumed.fit()
    want = {r["step"]: r for r in _comparable(read_metrics(straight))}
    got = {r["step"]: r for r in _comparable(read_metrics(out))}
    assert sorted(got) == [3, 4, 5]
    for step in got:  # the steps after the resume, on one rank, equal the straight run's
        assert got[step] == pytest.approx(want[step], rel=1e-4, abs=1e-6), step
