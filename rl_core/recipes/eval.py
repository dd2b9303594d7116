"""The evaluation recipe: `python -m rl_core eval CHECKPOINT DATA`, greedy accuracy and pass@k
of a model folder on a dataset, with the same reward functions as training."""

from __future__ import annotations

from collections.abc import Sequence

from rl_core.data.datasets import load_prompts
from rl_core.data.prompts import Prompts
from rl_core.data.templates import render_prompts
from rl_core.errors import InputError
from rl_core.evaluation import evaluate_prompts
from rl_core.models.loading import load_model_and_tokenizer
from rl_core.rewards import RewardComposer
from rl_core.rollout.native import NativeRolloutEngine, eos_ids
from rl_core.rollout.sampling import SamplingParams


def evaluate_checkpoint(checkpoint: str, data: str, *, k: int = 0, template: str = "plain",
                        max_new_tokens: int = 16, reward: str = "exact_match",
                        batch_size: int = 64, temperature: float = 1.0, seed: int = 0,
                        tools: Sequence[str] = (), max_turns: int = 4) -> dict:
    """The metrics of `evaluate_prompts` (prefix `eval`); with `tools` the responses are
    multi-turn with those tools on offer (`rl_core.rollout.turns`, at most `max_turns` turns
    of the model), and the tools' counts join the metrics (`eval/tools/*`)."""
    if k < 0:
        raise InputError(f"--k must be 0 or more, got {k}")
    if max_turns < 1:
        raise InputError(f"--max-turns must be 1 or more, got {max_turns}")
    model, tokenizer = load_model_and_tokenizer(checkpoint)
    records = load_prompts(data, prompt_key="prompt", answer_key="answer")
    rendered, _ = render_prompts(records, template, tokenizer)
    prompts = Prompts([tokenizer.encode(r.text, add_special_tokens=False) for r in rendered],
                      [r.record.ground_truth for r in rendered])
    rollout = NativeRolloutEngine(model, eos_token_ids=eos_ids(tokenizer, model),
                                  pad_token_id=tokenizer.pad_token_id)
    turns = None
    if tools:
        from rl_core.rollout.turns import MultiTurn, MultiTurnRollout
        from rl_core.tools import get_tool

        turns = MultiTurn(tokenizer, {name: get_tool(name) for name in tools},
                          max_turns=max_turns)
        rollout = MultiTurnRollout(rollout, turns)
    sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    with RewardComposer([reward]) as rewards:
        metrics = evaluate_prompts(rollout, tokenizer, rewards, prompts, sampling,
                                   batch_size=batch_size, seed=seed, prefix="eval", k=k)
    if turns is not None:
        metrics.update({f"eval/{key.split('/', 1)[1]}": value
                        for key, value in turns.metrics().items()})
    return {"checkpoint": checkpoint, "data": data, "prompts": len(prompts), **metrics}
