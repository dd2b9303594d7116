"""`actor.strategy: fsdp2` through the recipes: packed on two Ray ranks under a token budget it
equals the plain padded engine on one, the rollout's weights equal the trained ones after every
sync, and a sharded checkpoint saved on two ranks resumes on one and exports to transformers.
(Two sharded ranks equal the plain engine on one for each algorithm: the golden runs,
test_golden.py.)"""

from __future__ import annotations

import json

import pytest
import torch
from golden_runs import assert_close, comparable, golden_spec, sharded_spec
from test_trainer import read_metrics

from rl_core.errors import InputError
from rl_core.recipes import run
from rl_core.recipes.rl import RLTrainer
from rl_core.spec import resolve_spec

def test_packed_sharded_ranks_with_a_token_budget_equal_the_plain_padded_engine(
        tmp_path, sft_base, local_ray, plain_run):
    """PPO (actor, reference and critic sharded) with remove padding and Karmarkar–Karp
    micro-batches, its stages' rows balanced over the ranks by tokens: the plain run's metrics."""
    out = tmp_path / "run"
    spec = sharded_spec("ppo", sft_base, out, 2)
    longest = resolve_spec(spec).data.max_prompt_length + resolve_spec(spec).rollout.max_new_tokens
    spec["actor"].update(use_remove_padding=True, use_dynamic_bsz=True,
                         max_token_len_per_gpu=2 * longest)
    run(resolve_spec(spec), backend="ray")
    logged = comparable(read_metrics(out))
    plain = plain_run("ppo")
    assert [r["step"] for r in logged] == [r["step"] for r in plain]
    for got, want in zip(logged, plain):
        assert_close(got, want)


def test_the_rollout_holds_the_trained_weights_after_every_update(tmp_path, sft_base):
    trainer = RLTrainer(resolve_spec(sharded_spec("grpo", sft_base, tmp_path / "run", 1)))
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
        memory = trainer.ctl.memory_metrics()  # each stage's peak since the last call
        for stage in ("rollout", "old_logprob", "update", "weight_sync"):
            assert memory[f"memory/actor/{stage}/peak_gb"] > 0, stage
        assert memory["memory/reference/ref_logprob/peak_gb"] > 0
        assert memory["memory/actor/peak_gb"] >= memory["memory/actor/update/peak_gb"]
        again = trainer.ctl.memory_metrics()  # a new period: no stage has run in it yet
        assert {k.rsplit("/", 1)[0] for k in again} == {"memory/actor", "memory/reference"}
    finally:
        trainer.close()


def test_a_checkpoint_of_two_ranks_resumes_on_one(tmp_path, sft_base, local_ray, plain_run):
    out = tmp_path / "run"
    interrupted = RLTrainer(resolve_spec(sharded_spec("grpo", sft_base, out, 2)), backend="ray")
    for _ in range(2):
        interrupted.train_step()
        interrupted.step += 1
    saved = interrupted.save()  # each rank writes its shards; then the run "dies"
    interrupted.close()
    assert len(list((saved / "dcp" / "actor").glob("*.distcp"))) == 2
    _check_export(saved, tmp_path / "exported")
    with pytest.raises(InputError, match="saved with actor.strategy=fsdp2, this run uses torch"):
        RLTrainer(resolve_spec(golden_spec("grpo", sft_base, out, 1)))
    resumed = RLTrainer(resolve_spec(sharded_spec("grpo", sft_base, out, 1)))  # resume_mode auto
    assert resumed.step == 2
    resumed.fit()
    want = {r["step"]: r for r in plain_run("grpo")}  # a straight run (sharding changes nothing)
    got = {r["step"]: r for r in comparable(read_metrics(out))}
    assert sorted(got) == [3, 4, 5]
    for step in got:  # the steps after the resume, on one rank, equal the straight run's
        assert_close(got[step], want[step])


def _check_export(checkpoint, out) -> None:
    """`python -m rl_core export` of a two-rank checkpoint loads in transformers with the
    trained weights: the same logits as the checkpoint's own Hugging Face weights."""
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    done = subprocess.run([sys.executable, "-m", "rl_core", "export", str(checkpoint), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["weights"] == "sharded master weights"
    exported = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    trained = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True)
    ids = torch.arange(3, 19).reshape(2, 8)
    with torch.no_grad():
        assert torch.equal(exported(ids).logits, trained(ids).logits)
