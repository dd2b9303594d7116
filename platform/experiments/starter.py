"""The spec a new run starts from: the demo run of `make run` and the submit form's first values.

It trains the warm start `tiny:small-addition` (the tiny model after a short SFT, right about half
the time; made on first use) on two-digit addition, so rewards and validation accuracy rise
within a couple of minutes on 2 CPU cores. From the raw `tiny:small` every reward would be 0 and
nothing could be learned.
"""

from __future__ import annotations

import copy
from typing import Any

from rl_core.admission import built_in_models

STARTER_MODEL = "tiny:small-addition"
# What the run page says of a run on a built-in model, by model.path.
BUILT_IN_MODELS = built_in_models()
DEMO_NAME = "demo-grpo-tiny"  # the demo run's spec name
DEMO_LINE = ("The demo run: GRPO teaches a 1M-parameter model two-digit addition (“12+34=” → "
             "“46”), starting from a short SFT that is right about half the time; reward and "
             "validation accuracy rise within a couple of minutes.")

_STARTER: dict[str, Any] = {
    "seed": 1,
    "model": {"path": STARTER_MODEL},
    # the SFT of tiny:small-addition saw these training problems, never the validation ones
    "data": {"synthetic": {"task": "addition", "digits": 2, "num_train": 4000, "num_val": 200},
             "prompt_template": "chat", "train_batch_size": 16, "val_batch_size": 200},
    "rollout": {"max_new_tokens": 5},
    "actor": {"lr": 1.0e-4, "ppo_mini_batch_size": 16, "ppo_micro_batch_size": 64},
    "reward": {"functions": [{"name": "exact_match"}]},
    "trainer": {"total_steps": 60, "eval_every": 10, "save_every": 20},
}
# Per algorithm: GRPO and DAPO learn from groups of 8 samples (the preset has 4); micro-batches
# divide each algorithm's mini-batch of responses; DAPO's overlong buffer fits 5-token answers.
_BY_ALGORITHM: dict[str, dict[str, Any]] = {
    "grpo": {"rollout": {"n_samples_per_prompt": 8}},
    "dapo": {"rollout": {"n_samples_per_prompt": 8},
             "advantage": {"overlong_buffer": {"len": 2}}},
    "ppo": {"actor": {"ppo_micro_batch_size": 16}},
    "dpo": {"actor": {"ppo_micro_batch_size": 32}},
}


# The model families a new run can start from (the submit page's "Start from" links): what
# each is, and what it changes in the text starter. Each runs and learns on a CPU as it is.
STARTER_FAMILIES: dict[str, str] = {
    "text": "a dense text model: tiny:small-addition, two-digit addition",
    "moe": ("a mixture of experts: tiny:moe-addition (8 experts, 2 per token) with the routers' "
            "load-balancing loss; parallel.expert_parallel_size splits its experts over devices"),
    "vision": ("a vision-language model: tiny:vl-squares (a tiny Qwen2.5-VL) counting the "
               "squares in pictures, its rows packed with their pictures"),
    "agent": ("a tool-using agent: tiny:small-calculator learns to call the calculator for "
              "two-digit products over two turns (rollout.multi_turn; its SFT is made on first "
              "use, several minutes), the sample viewer showing the turns"),
}
_BY_FAMILY: dict[str, dict[str, Any]] = {
    "text": {},
    "moe": {"model": {"path": "tiny:moe-addition"},
            "actor": {"router_aux_loss_coef": 0.001}},
    # sampled at 0.5: the warm start is right when greedy but its distribution is still flat
    "vision": {"model": {"path": "tiny:vl-squares"},
               "data": {"synthetic": {"task": "squares", "num_train": 2000, "num_val": 100},
                        "val_batch_size": 100},
               "rollout": {"max_new_tokens": 3, "temperature": 0.5},
               "actor": {"lr": 2.0e-4, "use_remove_padding": True},
               "trainer": {"total_steps": 20}},
    # the problems of the warm start's SFT (its validation ones unseen); a response is a call,
    # the calculator's answer and the model's answer: about 140 tokens
    "agent": {"model": {"path": "tiny:small-calculator"},
              "data": {"synthetic": {"task": "multiplication", "digits": 2, "num_train": 7000,
                                     "num_val": 200}},
              "rollout": {"max_new_tokens": 160,
                          "multi_turn": {"max_turns": 2, "tools": [{"name": "calculator"}]}},
              "trainer": {"total_steps": 40}},
}


def starter_spec(algorithm: str = "grpo", family: str = "text") -> dict[str, Any]:
    """A small spec of `algorithm` for a model of `family` (`STARTER_FAMILIES`) that runs and
    learns on a CPU (the preset fills the rest)."""
    spec = {"algorithm": algorithm, **copy.deepcopy(_STARTER)}
    for changes in (_BY_ALGORITHM.get(algorithm, {}), _BY_FAMILY[family]):
        for section, values in changes.items():  # a key's value replaced whole
            spec.setdefault(section, {}).update(copy.deepcopy(values))
    return spec
