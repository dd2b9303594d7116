"""`reward.reward_model`: a one-label sequence-classification model scores each prompt and
response at its last real token, equal to its own forward over the unpadded sequence; folders
it cannot use and settings without it are refused naming the field; the memory plan counts it."""

from __future__ import annotations

import pytest
import torch

from rl_core.data.batch import Batch, left_pad
from rl_core.errors import InputError
from rl_core.models.tiny import build_tiny, save_tiny, save_tiny_reward_model
from rl_core.rewards.model import RewardModel
from rl_core.spec import SpecError, resolve_spec

PAD = 256


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_reward_model(tmp_path_factory.mktemp("rm") / "nano", "nano", seed=3)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny("nano")[1]


def rollout(prompts: list[list[int]], responses: list[list[int]]) -> Batch:
    """A rollout batch: prompts left-padded, responses right-padded (some empty)."""
    prompt_ids, prompt_mask = left_pad(prompts, PAD)
    width = max(max(len(r) for r in responses), 1)
    response_ids = torch.full((len(responses), width), PAD)
    response_mask = torch.zeros((len(responses), width), dtype=torch.long)
    for row, tokens in enumerate(responses):
        response_ids[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        response_mask[row, :len(tokens)] = 1
    return Batch({"prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
                  "response_ids": response_ids, "response_mask": response_mask})


def test_scores_equal_the_models_own_forward_over_each_unpadded_sequence(folder, tokenizer):
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 250, (n,), generator=generator).tolist() for n in (3, 7, 5, 1, 6)]
    responses = [torch.randint(0, 250, (n,), generator=generator).tolist() for n in (4, 0, 9, 2, 5)]
    cols = rollout(prompts, responses).with_sequences()
    scores = {}
    for micro in (1, 2, 5):
        model = RewardModel.load(folder, micro_batch_size=micro, policy_tokenizer=tokenizer)
        scores[micro] = model.score(cols["input_ids"], cols["attention_mask"],
                                    cols["position_ids"])
    assert scores[1].dtype == torch.float32 and scores[1].shape == (5,)
    assert torch.allclose(scores[1], scores[2], atol=1e-6)
    assert torch.allclose(scores[1], scores[5], atol=1e-6)
    with torch.no_grad():  # Hugging Face's own pooling: the last token of a lone sequence
        direct = torch.stack([model.model(input_ids=torch.tensor([p + r])).logits[0, 0]
                              for p, r in zip(prompts, responses)])
    torch.testing.assert_close(scores[1], direct, rtol=1e-5, atol=1e-5)
    assert len(set(scores[1].tolist())) == 5  # the rows differ: the head reads each row's own


def test_folders_a_reward_model_cannot_be_are_refused_naming_the_field(tmp_path, tokenizer):
    causal = save_tiny(tmp_path / "causal", "nano")  # no score head: loads with 2 labels
    with pytest.raises(InputError, match=r"reward.reward_model: the model has 2 labels"):
        RewardModel.load(causal, policy_tokenizer=tokenizer)
    with pytest.raises(InputError, match=r"reward.reward_model: .* is not a model folder"):
        RewardModel.load(tmp_path / "missing")
    other = build_tiny("nano")[1]
    other.add_tokens(["<extra>"])
    with pytest.raises(InputError, match=r"reward.reward_model: .*its embedding has \d+ tokens"):
        RewardModel.load(save_tiny_reward_model(tmp_path / "rm", "nano"), policy_tokenizer=other)


def spec(**reward) -> dict:
    return {"data": {"synthetic": {"task": "addition"}, "train_batch_size": 4},
            "model": {"path": "tiny:nano"}, "actor": {"ppo_mini_batch_size": 2},
            "reward": reward, "trainer": {"logger": []}}


def test_the_spec_takes_a_reward_model_alone_or_beside_the_functions(folder):
    alone = resolve_spec(spec(functions=[], reward_model=str(folder)))
    assert alone.reward.reward_model == str(folder) and alone.reward.functions == []
    both = resolve_spec(spec(reward_model=str(folder), reward_model_weight=0.5))
    assert both.reward.reward_model_weight == 0.5
    with pytest.raises(SpecError, match=r"reward.reward_model: tiny:nano is a tiny causal LM"):
        resolve_spec(spec(reward_model="tiny:nano"))
    with pytest.raises(SpecError, match=r"reward.reward_model_weight: is a reward-model setting"):
        resolve_spec(spec(reward_model_weight=2.0))
    with pytest.raises(SpecError, match=r"reward.functions: grpo needs a reward: add "
                                        r"reward.functions, reward.remote or "
                                        r"reward.reward_model"):
        resolve_spec(spec(functions=[]))
    validated = spec(functions=[], reward_model=str(folder))
    validated["trainer"]["eval_every"] = 5
    with pytest.raises(SpecError, match=r"trainer.eval_every: validation scores greedy answers "
                                        r"with reward.functions"):
        resolve_spec(validated)
    pairs = spec(reward_model=str(folder))
    pairs.update(algorithm="dpo", data={**pairs["data"], "chosen_key": "c", "rejected_key": "r"})
    with pytest.raises(SpecError, match=r"reward.reward_model: DPO from preference pairs"):
        resolve_spec(pairs)


def test_the_plan_counts_the_reward_model_on_every_device(folder):
    from rl_core import memory_plan as mp

    def components(**reward):
        plan = mp.plan(resolve_spec(spec(**reward)), mp.tiny_shape("nano"))
        return {c.name: c for c in plan.components}

    without, scored = components(), components(reward_model=str(folder),
                                               reward_model_micro_batch_size=2)
    assert not any(name.startswith("reward_model") for name in without)
    weights = scored["reward_model parameters"]
    held = sum(p.numel() for p in RewardModel.load(folder).model.parameters()) * 4  # float32
    assert weights.bytes == pytest.approx(held, rel=0.01)  # its config's shape, less the head
    assert weights.role == "reward_model" and weights.phases == mp.PHASES
    assert scored["reward_model forward"].phases == ("log-probs",)
    assert "2 rows" in scored["reward_model forward"].note
