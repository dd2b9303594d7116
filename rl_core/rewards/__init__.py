"""Rule-based rewards: one signature for every function, one registry, one weighted scorer.

    from rl_core.rewards import REWARDS, RewardComposer, get_reward

    get_reward("math_accuracy")("... so the answer is \\boxed{\\frac{1}{2}}", "0.5")  # 1.0
    with RewardComposer.from_config(spec.reward) as composer:
        scores = composer.score_batch(responses, answers)   # scores.total, scores.per_function

Every function is `fn(completion, ground_truth, **kwargs) -> float` (see `functions`), registered
by the name run specs use in `reward.functions`. Training (through `RewardComposer`, which adds
the per-call time limit and scores the cheap built-ins, `CHEAP_REWARDS`, in process) and
evaluation call the same functions. `code_execution` runs the response's program on test cases
in the sandbox of `rl_core.tools`; `reward.remote` adds the score of an HTTP reward service
(`rl_core.rewards.remote`). Importing this package is cheap: math-verify and sympy are imported
on first use.
"""

from rl_core.rewards.code import code_execution, last_code_block
from rl_core.rewards.composer import BatchScores, RewardComposer, RewardTerm, resolve_terms
from rl_core.rewards.equivalence import answers_match, parse_number
from rl_core.rewards.extract import extract_answer, last_boxed, last_number, strip_reasoning
from rl_core.rewards.functions import (
    countdown,
    exact_match,
    format_lenient,
    format_strict,
    math_accuracy,
)
from rl_core.rewards.registry import (
    CHEAP_REWARDS,
    REWARDS,
    RewardFn,
    UnknownRewardError,
    get_reward,
    reward_names,
)

__all__ = [
    "CHEAP_REWARDS",
    "REWARDS",
    "BatchScores",
    "RewardComposer",
    "RewardFn",
    "RewardTerm",
    "UnknownRewardError",
    "answers_match",
    "code_execution",
    "countdown",
    "exact_match",
    "extract_answer",
    "format_lenient",
    "format_strict",
    "get_reward",
    "last_boxed",
    "last_code_block",
    "last_number",
    "math_accuracy",
    "parse_number",
    "resolve_terms",
    "reward_names",
    "strip_reasoning",
]
