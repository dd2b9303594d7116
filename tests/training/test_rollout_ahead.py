"""Rollouts ahead of the update (`trainer.max_staleness`) on a rollout pool of its own, on a real
local Ray: one step off-policy GRPO learns, no batch is more than one version old, a checkpoint
keeps the batch generated ahead, a killed pool process ends the run naming the pool, and the
resumed run's steps equal the first attempt's."""

from __future__ import annotations

import os
import signal

import pytest
from learning import learning_spec, rose, validation_gain
from test_trainer import read_metrics

from rl_core.recipes.rl import RLTrainer
from rl_core.roles import RoleFailed
from rl_core.spec import resolve_spec
from rl_core.tracking import stable_metrics

STEPS = 10


def test_one_step_off_policy_learns_through_a_killed_pool(tmp_path, sft_base, local_ray):
    """One device trains while the other generates the next batch; the pool's process is
    killed in step 3, the run fails naming it, and the platform's resume (from step 2's
    checkpoint, which holds batch 3) goes on to learn the task."""
    spec = learning_spec(
        "grpo", sft_base, tmp_path, STEPS, resources={"devices_per_node": 2},
        parallel={"colocate_actor_rollout": False, "rollout_devices": 1},
        actor={"rollout_is": "token", "use_kl_loss": False}, reference={"enable": False},
        trainer={"max_staleness": 1, "save_every": 2, "deterministic": True})
    trainer = RLTrainer(resolve_spec(spec), backend="ray")
    pool_pid = trainer.roles.rollout.call("ping")[0]
    step = trainer.train_step

    def killing_step():  # step 3 trains the batch saved with step 2, batch 4 cannot be made
        if trainer.step == 2:
            os.kill(pool_pid, signal.SIGKILL)
        return step()

    trainer.train_step = killing_step
    with pytest.raises(RoleFailed, match=r"role rollout \(rank 0\) failed: its process died"):
        trainer.fit()
    first = [m for m in read_metrics(tmp_path) if m["step"] > 0]
    assert [m["step"] for m in first] == [1, 2, 3]
    # batch 1 from the initial weights; batch 2 generated during update 1, batch 3 during 2
    assert [m["async/staleness"] for m in first] == [0, 1, 1]
    assert [m["rollout/weight_version"] for m in first] == [0, 0, 1]
    assert all(m["rollout/weight_sync_bytes"] > 0 for m in first)
    assert "timing/weight_receive" in first[2] and "timing/rollout_busy" in first[0]

    resumed = RLTrainer(resolve_spec(spec), backend="ray")
    assert resumed.step == 2 and len(resumed.ahead.queue) == 1  # batch 3, from the checkpoint
    resumed.fit()
    again = [m for m in read_metrics(tmp_path)[len(first) + 1:] if "async/staleness" in m]
    assert [m["step"] for m in again] == list(range(3, STEPS + 1))
    assert [m["async/staleness"] for m in again] == [1] * (STEPS - 2)
    drop = ("channel/", "async/in_flight")
    left = {k: v for k, v in stable_metrics(first[2]).items() if not k.startswith(drop)}
    right = {k: v for k, v in stable_metrics(again[0]).items() if not k.startswith(drop)}
    assert left["actor/grad_norm"] > 0 and left == pytest.approx(right, rel=1e-6, abs=1e-7)
    before, after = validation_gain(tmp_path)
    assert rose(before, after), f"validation accuracy did not rise: {before} -> {after}"
