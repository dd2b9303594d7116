"""The menu of reward functions: a plain dict from the name used in run specs to the function."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Protocol

from rl_core.errors import InputError
from rl_core.rewards.code import code_execution
from rl_core.rewards.functions import (
    countdown,
    exact_match,
    format_lenient,
    format_strict,
    math_accuracy,
)


class RewardFn(Protocol):
    """The one signature of every reward function (see `rl_core.rewards.functions`)."""

    def __call__(self, completion: str, ground_truth: Any, **kwargs: Any) -> float: ...


class UnknownRewardError(InputError, KeyError):
    """A reward name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:
        return str(self.args[0])


REWARDS: dict[str, RewardFn] = {
    "math_accuracy": math_accuracy,
    "math": math_accuracy,
    "format": format_strict,
    "format_strict": format_strict,
    "format_lenient": format_lenient,
    "exact_match": exact_match,
    "countdown": countdown,
    "code_execution": code_execution,
}

# Built-ins scored in the calling process unless `reward.functions[i].in_process` says otherwise:
# each is pure, linear in the response (countdown's expression is capped at 256 characters and
# only adds, subtracts, multiplies and divides), so a call cannot run away and the worker round
# trip would cost more than the call. `math_accuracy` is not: math-verify runs without its own
# time limit (see `rl_core.rewards.equivalence`) and only a worker process can stop it.
CHEAP_REWARDS: frozenset[str] = frozenset(
    {"format", "format_strict", "format_lenient", "exact_match", "countdown"}
)


def reward_names() -> list[str]:
    """Every registered name, sorted."""
    return sorted(REWARDS)


def get_reward(name: str) -> RewardFn:
    """The function registered as `name`; UnknownRewardError (a KeyError) naming it and the valid
    names otherwise."""
    try:
        return REWARDS[name]
    except KeyError:
        raise UnknownRewardError(
            f"unknown reward function {name!r}: choose one of {', '.join(reward_names())}"
        ) from None


def check_kwargs(name: str, fn: RewardFn, kwargs: Mapping[str, Any]) -> None:
    """Raise TypeError when `fn` does not take `kwargs`, naming the keyword arguments it takes."""
    signature = inspect.signature(fn)
    try:
        signature.bind("", None, **kwargs)
    except TypeError:
        valid = [
            p.name
            for p in list(signature.parameters.values())[2:]
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        raise TypeError(
            f"reward function {name!r} does not take {sorted(kwargs)}: "
            f"its keyword arguments are {', '.join(valid) or '(none)'}"
        ) from None
