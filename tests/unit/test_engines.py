"""The engine interfaces: the built engines implement their Protocols, are chosen by name, hand
weights over in buckets, and the critic's value head is composed into the same training engine."""

from __future__ import annotations

import copy

import pytest
import torch

from rl_core.engines import training_engine
from rl_core.engines.base import TrainingEngine
from rl_core.engines.train import LogProbHead, TrainEngine, ValueHead
from rl_core.errors import InputError
from rl_core.models.tiny import build_tiny
from rl_core.rollout import rollout_engine
from rl_core.rollout.base import RolloutEngine
from rl_core.rollout.native import NativeRolloutEngine
from rl_core.rollout.sampling import SamplingParams


@pytest.fixture(scope="module")
def tiny():
    return build_tiny("nano", seed=3)


def test_engines_are_chosen_by_the_names_the_spec_uses():
    assert training_engine("torch") is TrainEngine
    assert training_engine("megatron").__name__ == "MegatronEngine"
    assert rollout_engine("native") is NativeRolloutEngine
    with pytest.raises(InputError, match="actor.strategy: no engine named 'deepspeed'; "
                                         "choose one of torch, fsdp2, megatron"):
        training_engine("deepspeed")
    with pytest.raises(InputError, match="rollout.engine: no engine named 'sglang'"):
        rollout_engine("sglang")


def test_the_built_engines_implement_their_protocols(tiny):
    model, tokenizer = tiny
    engine = TrainEngine(copy.deepcopy(model), lr=1e-3)
    assert isinstance(engine, TrainingEngine)
    assert isinstance(NativeRolloutEngine.from_spec(model, tokenizer, None), RolloutEngine)


def test_weight_buckets_cover_every_weight_once_within_the_budget(tiny):
    engine = TrainEngine(copy.deepcopy(tiny[0]), lr=1e-3)
    state = engine.model.state_dict()
    largest = max(t.numel() * t.element_size() for t in state.values())
    budget = 2 * largest
    buckets = list(engine.weight_buckets(bucket_bytes=budget))
    names = [name for bucket in buckets for name, _ in bucket]
    assert sorted(names) == sorted(state) and len(names) == len(set(names))
    assert len(buckets) > 1
    for bucket in buckets:
        assert sum(t.numel() * t.element_size() for _, t in bucket) <= budget


def test_a_rollout_engine_over_its_own_model_takes_the_trained_weights(tiny):
    model, tokenizer = tiny
    trained = TrainEngine(copy.deepcopy(model), lr=1e-3)
    with torch.no_grad():
        for param in trained.model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    rollout = NativeRolloutEngine.from_spec(copy.deepcopy(model), tokenizer, None)
    params = SamplingParams(max_new_tokens=6, do_sample=False)
    prompts = [[5, 9, 11], [40, 41]]
    reference = NativeRolloutEngine.from_spec(trained.model, tokenizer, None).generate(prompts, params)
    assert not torch.equal(rollout.generate(prompts, params).logprobs, reference.logprobs)
    rollout.load_weights(trained.weight_buckets(bucket_bytes=1 << 16))
    synced = rollout.generate(prompts, params)
    assert torch.equal(synced.response_ids, reference.response_ids)
    assert torch.allclose(synced.logprobs, reference.logprobs)
    with pytest.raises(KeyError, match="no weight named 'head.extra'"):
        rollout.load_weights([[("head.extra", torch.zeros(1))]])


def test_offload_and_reload_keep_the_optimizer_state(tiny):
    engine = TrainEngine(copy.deepcopy(tiny[0]), lr=1e-3)
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.offload()
    engine.reload()
    after = engine.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_value_head_is_composed_into_the_same_engine(tiny):
    from transformers import AutoModelForTokenClassification, Qwen2Config

    config = Qwen2Config(**{k: v for k, v in tiny[0].config.to_dict().items()
                            if k not in ("id2label", "label2id")}, num_labels=1)
    value_model = AutoModelForTokenClassification.from_config(config)
    critic = TrainEngine(value_model, lr=1e-3, head=ValueHead(), metric_prefix="critic/")
    policy = TrainEngine(copy.deepcopy(tiny[0]), lr=1e-3)
    assert isinstance(policy.head, LogProbHead)
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    mask = torch.ones_like(ids)
    positions = torch.arange(5)[None]
    values, entropy = critic.forward_logprobs(ids, mask, positions, response_len=2)
    assert values.shape == (1, 2) and entropy is None
    with torch.no_grad():
        out = value_model.eval()(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    # the values of the states before response tokens 3 and 4: positions 2 and 3
    assert torch.allclose(values, out[:, 2:4, 0].float())
