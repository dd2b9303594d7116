"""GRPO scored by a learned reward model (`reward.reward_model`): beside a rule reward in one
process, and alone on two Ray ranks, where the model is a role of its own on each device."""

from __future__ import annotations

import pytest
from learning import learning_spec
from test_trainer import read_metrics

from rl_core.models.tiny import save_tiny_reward_model
from rl_core.recipes import run
from rl_core.spec import resolve_spec


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    return str(save_tiny_reward_model(tmp_path_factory.mktemp("rm") / "nano", "nano", seed=3))


def test_the_reward_is_the_rules_plus_the_weighted_model_score(tmp_path, sft_base, reward_model):
    out = tmp_path / "run"
    spec = learning_spec("grpo", sft_base, out, 2, reward={
        "functions": [{"name": "exact_match"}], "reward_model": reward_model,
        "reward_model_weight": 0.5, "reward_model_micro_batch_size": 8})
    run(resolve_spec(spec))
    logged = [m for m in read_metrics(out) if "reward/mean" in m]
    assert [m["step"] for m in logged] == [1, 2]
    for m in logged:
        assert m["reward/model/std"] > 0  # the model tells the responses apart
        assert m["reward/mean"] == pytest.approx(
            m["reward/exact_match/mean"] + 0.5 * m["reward/model/mean"], abs=1e-5)
        assert m["timing/rm_score"] > 0 and "channel/wait_s/rm_score" in m


def test_a_reward_model_alone_scores_on_two_ray_ranks(tmp_path, sft_base, reward_model,
                                                      local_ray):
    out = tmp_path / "ray"
    spec = learning_spec("grpo", sft_base, out, 2, resources={"devices_per_node": 2},
                         reward={"functions": [], "reward_model": reward_model})
    spec["trainer"] = {**spec["trainer"], "eval_every": 0}
    run(resolve_spec(spec), backend="ray")
    logged = read_metrics(out)
    assert [m["step"] for m in logged] == [1, 2]
    for m in logged:
        assert m["reward/mean"] == pytest.approx(m["reward/model/mean"], abs=1e-5)
        assert m["reward/model/std"] > 0 and m["actor/grad_norm"] > 0
