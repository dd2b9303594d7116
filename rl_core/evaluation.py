"""Evaluation: greedy accuracy, mean reward and pass@k of a policy on prompts with answers.

    metrics = evaluate_prompts(rollout, tokenizer, rewards, prompts, sampling, batch_size=64,
                               seed=spec.seed, prefix="val", k=8)

`rollout` is any rollout engine (`rl_core.engines.base.RolloutEngine`: in training, the actor's
ranks behind one `generate`), `rewards` scores texts (`RewardComposer` or a view of the reward
workers). The scores come from the same reward functions as training, so the two cannot drift.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from rl_core.data.prompts import Prompts, decode_responses
from rl_core.rollout.sampling import SamplingParams

CORRECTNESS_REWARDS = ("math_accuracy", "math", "exact_match", "countdown")


def correctness_name(names: list[str]) -> str | None:
    """The reward function that says whether an answer is right, if the spec has one."""
    return next((n for n in names if n in CORRECTNESS_REWARDS), None)


def _batches(items: list, size: int):
    for start in range(0, len(items), size):
        yield start, items[start:start + size]


@torch.no_grad()
def score_prompts(rollout, tokenizer, rewards, prompts, params: SamplingParams, batch_size: int,
                  generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(total rewards (N, n), correctness (N, n)) for N prompts with n samples each."""
    totals, correct = [], []
    key = correctness_name(rewards.names)
    for start, ids in _batches(prompts.ids, batch_size):
        batch = rollout.generate(ids, params, generator=generator)
        truths = [prompts.truths[start + i] for i in batch.prompt_index.tolist()]
        prompt_texts = [tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
                        for ids, mask in zip(batch.prompt_ids, batch.prompt_mask)]
        scored = rewards.score_batch(decode_responses(tokenizer, batch), truths,
                                     prompts=prompt_texts)
        totals.append(torch.tensor(scored.total).view(len(ids), params.n))
        hits = scored.per_function[key] if key else scored.total
        correct.append((torch.tensor(hits) >= (1.0 if key else 1e-9)).float().view(len(ids), params.n))
    return torch.cat(totals), torch.cat(correct)


def evaluate_prompts(rollout, tokenizer, rewards, prompts: Prompts, sampling: SamplingParams, *,
                     batch_size: int, seed: int, prefix: str = "val", k: int = 0) -> dict[str, float]:
    """Greedy accuracy and mean reward; pass@k from k samples at the `sampling` settings (seeded
    by `seed + 1`) when k > 0."""
    greedy = replace(sampling, do_sample=False, n=1)
    totals, correct = score_prompts(rollout, tokenizer, rewards, prompts, greedy, batch_size)
    metrics = {f"{prefix}/accuracy": float(correct.mean()), f"{prefix}/reward_mean": float(totals.mean())}
    if k > 0:
        generator = torch.Generator().manual_seed(seed + 1)
        _, hits = score_prompts(rollout, tokenizer, rewards, prompts, replace(sampling, n=k),
                                max(1, batch_size // k), generator)
        metrics[f"{prefix}/pass@{k}"] = float(hits.max(dim=1).values.mean())
    return metrics
