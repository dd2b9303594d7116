"""The run spec: one typed, documented description of an RL post-training run.

`RunSpec` is the contract between the platform and the trainer: the API validates submissions
with it, the UI builds its form from its JSON Schema, the docs list its fields and the trainer
reads it. This module imports only pydantic, PyYAML and the standard library, so the web process
can validate a spec without torch.

A spec is resolved in three steps (`resolve_spec`): dotted overrides are applied to the user's
mapping, the algorithm's preset fills what the user left out, and the model validates field
types, then refuses values that are not implemented yet (`NOT_IMPLEMENTED`), then checks the
cross-field rules (`_RULES`); every message says what to change.

Every source of a spec meets the same limits (`MAX_*` below): YAML is read without anchors,
aliases or tags (`load_yaml`), the raw mapping is bounded in depth, values and bytes
(`check_spec_bounds`), floats are finite and every number has a plausible upper bound.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import re
import types
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from rl_core.errors import InputError

ALGORITHMS = ("grpo", "dapo", "ppo", "dpo")
DEVICE_TYPES = ("npu", "gpu", "cpu")

Algorithm = Literal["grpo", "dapo", "ppo", "dpo"]
DeviceType = Literal["npu", "gpu", "cpu"]
AdvEstimator = Literal[
    "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "gae"
]
KLType = Literal["k1", "abs", "k2", "k3", "low_var_kl", "mse"]
LossAggMode = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
]

# Estimators whose baseline comes from the other responses to the same prompt.
GROUP_ESTIMATORS = frozenset({"grpo", "dr_grpo", "rloo", "reinforce_plus_plus_baseline"})

Violation = tuple[str, str]  # (field path, message)

# --------------------------------------------------------------------------- limits
# A spec is a small document: these bound what any source (JSON body, overrides, YAML) may send.

MAX_YAML_CHARS = 65_536  # characters of YAML text read at once (a spec file, an override value)
MAX_SPEC_DEPTH = 16  # nesting levels of mappings and lists; the top-level mapping is level 1
MAX_SPEC_NODES = 4_000  # mappings, list items and scalars in one spec
MAX_SPEC_BYTES = 65_536  # the spec serialized as JSON
MAX_KWARGS_DEPTH = 8  # nesting levels inside one reward function's kwargs
MAX_KWARGS_NODES = 1_000  # mappings, list items and scalars in one reward function's kwargs
MAX_KWARGS_BYTES = 16_384  # one reward function's kwargs serialized as JSON
MAX_INT = 2**63  # every integer of a spec is below this (64-bit signed)

# Plausible upper bounds of the numeric fields.
MAX_NODES = 4_096  # resources.num_nodes
MAX_DEVICES_PER_NODE = 64  # resources.devices_per_node
MAX_DEVICES = MAX_NODES * MAX_DEVICES_PER_NODE  # devices in one run
MAX_PARALLEL = 1_024  # tensor, pipeline and context parallel sizes
MAX_STEPS = 10_000_000  # steps, warmups, intervals, horizons
MAX_EPOCHS = 10_000  # trainer.total_epochs
MAX_TOKENS = 131_072  # prompt and response lengths
MAX_TOKEN_BUDGET = 1_048_576  # tokens of one dynamic micro-batch
MAX_BATCH = 16_384  # prompts in a batch
MAX_MICRO_BATCH = 4_096  # responses per device per forward
MAX_SAMPLES = 1_024  # responses per prompt
MAX_LIST = 1_024  # items of a list of steps, ranks, files or module names


def _scan(value: Any, max_depth: int, max_nodes: int, json_only: bool = False) -> Violation | None:
    """The first (dotted path, problem) of a nested value beyond the bounds, found without
    recursion; None when it fits. `json_only` also refuses non-text keys, inf, nan and integers
    of more than 64 bits. Every mapping, list and scalar counts as one value."""
    stack: list[tuple[tuple[str, ...], Any, int]] = [((), value, 1)]
    nodes = 1
    while stack:
        path, node, depth = stack.pop()
        where = ".".join(path)
        if isinstance(node, Mapping):
            children: Iterable[tuple[Any, Any]] = node.items()
        elif isinstance(node, list | tuple):
            children = enumerate(node)
        else:
            problem = _scalar_problem(node) if json_only or isinstance(node, str) else None
            if problem:
                return where, problem
            continue
        if depth > max_depth:
            return where, f"nested deeper than the limit of {max_depth} levels: flatten it"
        nodes += len(node)
        if nodes > max_nodes:
            return "", (
                f"more than the limit of {max_nodes} values (mappings, list items and scalars): "
                "make it smaller; large data belongs in files"
            )
        for key, child in children:
            if json_only and isinstance(node, Mapping) and not isinstance(key, str):
                return where, f"key {key!r} must be text: quote it"
            if isinstance(key, str) and "\x00" in key:
                return where, f"key {key!r} holds a NUL character, which text may not hold"
            stack.append(((*path, str(key)), child, depth + 1))
    return None


# Characters a name may not hold although they are text: controls (NUL, newline, escape, C1),
# line and paragraph separators, and the bidirectional controls, which reorder what a reader
# sees ("invoice\u202efdp.exe" shows as "invoiceexe.pdf"). PLAIN_TEXT_PATTERN says the same as a
# regular expression (for OpenAPI documents, where Python and JavaScript read it alike).
NOT_PLAIN_CHARS = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
PLAIN_TEXT_PATTERN = f"^[^{NOT_PLAIN_CHARS}]*$"
_NOT_PLAIN_CHAR = re.compile(f"[{NOT_PLAIN_CHARS}]")


def plain_text_problem(text: str) -> str | None:
    """Why `text` is not one line of plain text (None when it is): a control character (NUL,
    newline, tab, escape), a line separator or a bidirectional control such as a right-to-left
    override. Any script and emoji are plain text."""
    found = _NOT_PLAIN_CHAR.search(text)
    if found is None:
        return None
    char = found.group()
    code = f"U+{ord(char):04X}"
    if char == "\x00":
        return "holds a NUL character, which text may not hold: remove it"
    if unicodedata.category(char) == "Cc":
        return f"holds the control character {code}: use one line of plain text"
    if char in "\u2028\u2029":
        return f"holds the line separator {code}: use one line of plain text"
    return (f"holds the bidirectional control {code} (such as a right-to-left override), which "
            "changes how the text reads: use plain text")


def _scalar_problem(value: Any) -> str | None:
    if isinstance(value, str) and "\x00" in value:
        return "holds a NUL character, which text may not hold: remove it"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number: use a finite number"
    if isinstance(value, int) and not isinstance(value, bool) and not -MAX_INT <= value < MAX_INT:
        return f"integers must fit in 64 bits (below {MAX_INT}): use a smaller number"
    return None


def _bounded_json(value: Any) -> Any:
    """Reward kwargs: JSON values within depth, count and size limits (checked before typing)."""
    problem = _scan(value, MAX_KWARGS_DEPTH, MAX_KWARGS_NODES, json_only=True)
    if problem:
        where, message = problem
        raise ValueError(f"{where}: {message}" if where else message)
    size = len(json.dumps(value, default=str))
    if size > MAX_KWARGS_BYTES:
        raise ValueError(
            f"{size} bytes as JSON, more than the limit of {MAX_KWARGS_BYTES}: pass less, or a "
            "file name the function reads"
        )
    return value


# A mapping of JSON values with text keys (finite numbers, bounded depth and size).
JsonMapping = Annotated[dict[str, JsonValue], BeforeValidator(_bounded_json)]


def _known_tiny(value: str | None) -> str | None:
    """A `tiny:` name must be a built-in preset (the path policy lets only those through)."""
    if value is not None:
        from rl_core.models.presets import parse_tiny_path  # torch-free

        parse_tiny_path(value)  # ValueError naming the presets
    return value


# A model folder, or the name of a built-in tiny model (`tiny:small`).
ModelLocation = Annotated[str, AfterValidator(_known_tiny)]


class _Strict(BaseModel):
    # Unknown keys are errors; numbers given for text fields (name: 2024) become text; floats
    # are finite (inf and nan are refused).
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _whole_float_as_int(cls, value: Any, info: ValidationInfo) -> Any:
        """1e30 for an integer field is the integer 10**30, so its bound check says the limit."""
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, float) and value.is_integer() and field is not None:
            if _without_none(field.annotation) is int:
                return int(value)
        return value


# --------------------------------------------------------------------------- sections


class ModelConfig(_Strict):
    """The policy model: what is trained and generates."""

    path: ModelLocation = Field(
        "tiny:small",
        min_length=1,
        description="Hugging Face model folder, or `tiny:<size>` for the built-in tiny model "
        "used by tests and CPU runs (nano, small, base), or `tiny:small-addition`: tiny:small "
        "after a short SFT on two-digit addition, right about half the time (made on first use).",
    )
    tokenizer_path: ModelLocation | None = Field(
        None, description="Tokenizer folder; null uses `model.path`."
    )
    dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "float32", description="Parameter and compute dtype (bfloat16 on NPU/GPU, float32 on CPU)."
    )
    trust_remote_code: bool = Field(
        False, description="Allow model code shipped inside the model folder to run."
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations during backward to save device memory."
    )


class SyntheticData(_Strict):
    """Generated arithmetic prompts with exact answers, for tests and smoke runs."""

    task: Literal["addition", "multiplication", "countdown"] = Field(
        "addition", description="Which generated task to use."
    )
    digits: int = Field(2, ge=1, le=9, description="Digits per operand.")
    num_train: int = Field(256, gt=0, le=1_000_000, description="Number of training prompts.")
    num_val: int = Field(32, ge=0, le=100_000, description="Number of validation prompts.")


class DataConfig(_Strict):
    """Prompts (and, for DPO, preference pairs) and how they are batched."""

    train_files: list[str] = Field(
        default_factory=list,
        max_length=MAX_LIST,
        description="Training files (jsonl or parquet), one record per prompt. "
        "Set this or `data.synthetic`.",
    )
    val_files: list[str] = Field(
        default_factory=list, max_length=MAX_LIST, description="Validation files."
    )
    synthetic: SyntheticData | None = Field(
        None, description="Generated data instead of files; null when files are used."
    )
    prompt_key: str = Field("prompt", description="Record field holding the prompt.")
    answer_key: str = Field(
        "answer", description="Record field holding the reference answer given to rewards."
    )
    chosen_key: str | None = Field(
        None, description="DPO: record field holding the preferred response."
    )
    rejected_key: str | None = Field(
        None, description="DPO: record field holding the rejected response."
    )
    prompt_template: str = Field(
        "chat",
        min_length=1,
        description="`chat` applies the tokenizer's chat template; another name selects a "
        "template registered in `rl_core.data`.",
    )
    max_prompt_length: int = Field(
        128, gt=0, le=MAX_TOKENS,
        description="Longest prompt in tokens; longer prompts are skipped."
    )
    shuffle: bool = Field(True, description="Shuffle training prompts every epoch.")
    train_batch_size: int = Field(
        4,
        gt=0,
        le=MAX_BATCH,
        description="Prompts per training step; each yields `rollout.n_samples_per_prompt` "
        "responses.",
    )
    val_batch_size: int = Field(
        8, gt=0, le=MAX_BATCH, description="Prompts per validation generation batch.")


class RolloutConfig(_Strict):
    """Response generation. `tensor_parallel_size` here is the inference layout."""

    engine: Literal["native", "vllm"] = Field(
        "native",
        description="`native` generates with the training weights in the same process; "
        "`vllm` with an in-process vLLM engine on each actor rank (vllm-ascend on Ascend, "
        "vLLM's CPU build on cpu), synced from the training engine after every update.",
    )
    n_samples_per_prompt: int = Field(
        4,
        gt=0,
        le=MAX_SAMPLES,
        description="Responses generated per prompt: the group of GRPO-family estimators, "
        "2 for a DPO pair.",
    )
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass; 1 disables.")
    top_k: int = Field(
        -1, ge=-1, le=1_000_000,
        description="Sample among the k likeliest tokens; -1 or 0 disables."
    )
    min_p: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Drop tokens below this fraction of the top probability; 0 disables.",
    )
    max_new_tokens: int = Field(
        64, gt=0, le=MAX_TOKENS, description="Longest response in tokens (response length)."
    )
    do_sample: bool = Field(
        True,
        description="Sample; false decodes greedily and ignores temperature, top_p, top_k, min_p.",
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1,
        description="vLLM on an accelerator: fraction of device memory for its weights and KV "
        "cache while it generates (given back to training while it sleeps).",
    )
    max_model_len: int | None = Field(
        None, gt=0, le=2 * MAX_TOKENS,
        description="vLLM: longest prompt + response in tokens; default "
        "data.max_prompt_length + rollout.max_new_tokens.",
    )
    partial_rollout_max_split: int = Field(
        0,
        ge=0,
        le=1_024,
        description="Partial rollout: each rollout call generates at most max_new_tokens / N "
        "tokens per response; unfinished responses wait and go on in the next call (the next "
        "step's, under the updated policy) ahead of new prompts, and a step trains once "
        "data.train_batch_size groups have all their responses finished, so one long response "
        "does not stall a step; 0 or 1 turns it off.",
    )
    partial_rollout_max_age: int | None = Field(
        None,
        ge=1,
        le=1_024,
        description="Partial rollout: the most policy versions one response's pieces may come "
        "from; a response whose next piece would come from a later one is cut there (ended, "
        "not finished). Default: partial_rollout_max_split, enough for a response that gets "
        "a piece in every step to reach max_new_tokens.",
    )
    tensor_parallel_size: int = Field(
        1,
        gt=0,
        le=MAX_PARALLEL,
        description="Inference tensor-parallel size; may differ from "
        "`parallel.tensor_parallel_size` (weights are resharded).",
    )
    log_prob_micro_batch_size: int = Field(
        4,
        gt=0,
        le=MAX_MICRO_BATCH,
        description="Responses per device per forward when computing old log-probs."
    )


class OffloadConfig(_Strict):
    """What the actor keeps in host memory while it is not training."""

    param: bool = Field(
        False, description="With `actor.strategy: fsdp2`: keep the shards of parameters, "
        "gradients and optimizer state in host memory (FSDP2's CPUOffloadPolicy, pinned); each "
        "decoder layer comes to the device for its forward and backward and AdamW steps on the "
        "host. Not on cpu.")
    optimizer: bool = Field(
        False, description="Keep AdamW's moments in host memory; they come to the device for "
        "each optimizer step only. Not on cpu."
    )


class ActorConfig(_Strict):
    """The policy update: optimizer, PPO-style clipped loss, KL loss and batching."""

    strategy: Literal["torch", "fsdp2"] = Field(
        "torch",
        description="Training engine: `torch` is the plain PyTorch engine, one full copy of the "
        "model, gradients and optimizer state per data-parallel rank; `fsdp2` shards them over "
        "the ranks with PyTorch FSDP2 (float32 master weights, compute in `model.dtype`; the "
        "rollout keeps a full copy synced after every update; the critic is sharded the same "
        "way and the reference without optimizer state; checkpoints are sharded with "
        "torch.distributed.checkpoint).",
    )
    lr: float = Field(1e-5, gt=0, le=1, description="Learning rate.")
    weight_decay: float = Field(0.01, ge=0, le=1, description="AdamW weight decay.")
    warmup_steps: int = Field(
        0, ge=0, le=MAX_STEPS, description="Linear learning-rate warmup steps.")
    lr_scheduler: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="Learning-rate schedule after warmup."
    )
    grad_clip: float = Field(
        1.0, ge=0, le=1_000, description="Clip the global gradient norm to this; 0 disables."
    )
    ppo_mini_batch_size: int = Field(
        2,
        gt=0,
        le=MAX_BATCH,
        description="Prompts per optimizer step (verl's convention): one step updates on "
        "ppo_mini_batch_size × n_samples_per_prompt responses.",
    )
    ppo_micro_batch_size: int = Field(
        2,
        gt=0,
        le=MAX_MICRO_BATCH,
        description="Responses per device per forward/backward (gradient accumulation unit); "
        "ignored with `use_dynamic_bsz`.",
    )
    ppo_epochs: int = Field(1, gt=0, le=100, description="Passes over each step's responses.")
    clip_ratio_low: float = Field(
        0.2, ge=0, le=1, description="Lower clip of the probability ratio: 1 - low."
    )
    clip_ratio_high: float = Field(
        0.2, ge=0, le=10,
        description="Upper clip of the probability ratio: 1 + high (DAPO clip-higher)."
    )
    clip_ratio_c: float = Field(
        3.0, gt=1, le=100, description="Dual-clip bound on the loss of negative-advantage tokens."
    )
    policy_loss: Literal["vanilla", "gspo"] = Field(
        "vanilla", description="`vanilla`: token-level PPO clip; `gspo`: sequence-level ratio."
    )
    loss_agg_mode: LossAggMode = Field(
        "token-mean", description="How token losses are averaged into the batch loss."
    )
    entropy_coeff: float = Field(0.0, ge=0, le=10, description="Weight of the entropy bonus.")
    use_kl_loss: bool = Field(
        True, description="Add a KL(policy ‖ reference) term to the loss (needs the reference)."
    )
    kl_loss_coef: float = Field(0.001, ge=0, le=100, description="Weight of the KL loss.")
    kl_loss_type: KLType = Field(
        "low_var_kl",
        description="KL estimator: k1, abs, k2 (alias mse), k3 (alias low_var_kl).",
    )
    use_remove_padding: bool = Field(
        False,
        description="Pack each micro-batch's rows into one sequence of their real tokens, "
        "attention confined to each row, for every forward and backward of the actor, the "
        "reference and the critic (needs sdpa, eager or flash-attention in the model).",
    )
    use_dynamic_bsz: bool = Field(
        False,
        description="Form micro-batches by a token budget (`max_token_len_per_gpu`, balanced "
        "by Karmarkar–Karp) instead of row counts, for updates and log-prob passes of every "
        "role; pair it with use_remove_padding; not with dpo.",
    )
    max_token_len_per_gpu: int = Field(
        1024,
        gt=0,
        le=MAX_TOKEN_BUDGET,
        description="Token budget of a micro-batch per device with `use_dynamic_bsz`."
    )
    offload: OffloadConfig = Field(
        default_factory=OffloadConfig, description="Host-memory offload of the actor."
    )
    rollout_is: Literal["off", "token", "sequence"] = Field(
        "off",
        description="Truncated importance sampling against the rollout engine's log-probs "
        "(they differ from the training engine's): `token` weights each token by "
        "min(exp(old - rollout), cap), `sequence` each response by the capped ratio of its sum.",
    )
    rollout_is_cap: float = Field(
        2.0, ge=1, le=1_000, description="Upper bound of the `rollout_is` weights."
    )


class OverlongBuffer(_Strict):
    """DAPO soft overlong punishment of responses near `rollout.max_new_tokens`."""

    enable: bool = Field(False, description="Penalise responses that enter the buffer.")
    len: int = Field(
        16,
        gt=0,
        le=MAX_TOKENS,
        description="Buffer length in tokens, counted back from `rollout.max_new_tokens`."
    )
    penalty_factor: float = Field(
        1.0, ge=0, le=100, description="Penalty at the maximum length, linear over the buffer."
    )


class DynamicSampling(_Strict):
    """DAPO dynamic sampling: drop prompt groups whose rewards are all equal."""

    enable: bool = Field(
        False, description="Keep generating until a step has enough informative groups."
    )
    max_num_gen_batches: int = Field(
        10, ge=0, le=1_000, description="Most generation batches per step; 0 means no limit."
    )


class AdvantageConfig(_Strict):
    """Advantage estimation and reward shaping."""

    adv_estimator: AdvEstimator | None = Field(
        "grpo", description="Advantage estimator; null for DPO, which has none."
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor (gae, reinforce_plus_plus).")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    norm_adv_by_std_in_grpo: bool = Field(
        True, description="Divide group-relative advantages by the group's std (false: Dr. GRPO)."
    )
    use_kl_in_reward: bool = Field(
        False, description="Subtract a KL(policy ‖ reference) penalty from the reward."
    )
    kl_penalty: KLType = Field("k1", description="KL estimator of the in-reward penalty.")
    kl_ctrl: Literal["fixed", "adaptive"] = Field(
        "fixed", description="In-reward KL coefficient: fixed, or adapted toward `kl_target`."
    )
    kl_coef: float = Field(0.001, ge=0, le=100, description="(Initial) in-reward KL coefficient.")
    kl_target: float = Field(0.1, gt=0, le=100, description="Adaptive KL control: target KL.")
    kl_horizon: int = Field(
        10000, gt=0, le=MAX_STEPS, description="Adaptive KL control: horizon in steps.")
    overlong_buffer: OverlongBuffer = Field(
        default_factory=OverlongBuffer, description="DAPO overlong reward shaping."
    )
    dynamic_sampling: DynamicSampling = Field(
        default_factory=DynamicSampling, description="DAPO dynamic sampling."
    )


class DPOConfig(_Strict):
    """Direct preference optimisation (used when `algorithm` is dpo)."""

    beta: float = Field(0.1, gt=0, le=100, description="Strength of the implicit KL constraint.")
    loss_type: Literal["sigmoid", "ipo", "hinge"] = Field(
        "sigmoid", description="DPO loss variant."
    )
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="Assumed label noise of the pairs (conservative DPO)."
    )
    sft_loss_coef: float = Field(
        0.0, ge=0, le=100, description="Weight of an added NLL loss on the chosen responses."
    )


class ReferenceConfig(_Strict):
    """The frozen reference policy used by KL terms and DPO."""

    enable: bool = Field(True, description="Run a reference model.")
    offload: bool = Field(
        False, description="Keep reference parameters in host memory between uses."
    )
    log_prob_micro_batch_size: int = Field(
        4,
        gt=0,
        le=MAX_MICRO_BATCH,
        description="Responses per device per forward when computing reference log-probs."
    )


class CriticConfig(_Strict):
    """The value model (PPO only)."""

    enable: bool = Field(False, description="Train a critic; PPO requires it, others forbid it.")
    model_path: ModelLocation | None = Field(
        None, description="Critic initialisation; null uses `model.path`."
    )
    lr: float = Field(1e-5, gt=0, le=1, description="Critic learning rate.")
    cliprange_value: float = Field(0.5, gt=0, le=100, description="Clip range of the value loss.")
    ppo_micro_batch_size: int = Field(
        2, gt=0, le=MAX_MICRO_BATCH, description="Responses per device per critic forward/backward."
    )
    warmup_steps: int = Field(
        0, ge=0, le=MAX_STEPS, description="Critic learning-rate warmup steps.")


class RewardFunctionSpec(_Strict):
    """One rule-based reward function from `rl_core.rewards`."""

    name: str = Field(
        min_length=1, description="Registered name, e.g. `math_accuracy`, `format`, `exact_match`."
    )
    weight: float = Field(
        1.0, ge=-1_000, le=1_000, description="Weight of this function in the summed reward."
    )
    kwargs: JsonMapping = Field(
        default_factory=dict,
        description="Keyword arguments passed to the function: JSON values (finite numbers), "
        f"at most {MAX_KWARGS_DEPTH} levels deep and {MAX_KWARGS_NODES} values.",
    )
    in_process: bool | None = Field(
        None,
        description="Where the function runs. Null: in the reward process for the cheap "
        "built-ins (format, format_strict, format_lenient, exact_match, countdown), in the "
        "worker pool otherwise (math_accuracy). False: always in the pool, where an overrunning "
        "call is stopped. True: always in process, without the round trip to a worker; a call "
        "past `reward.timeout_s` still scores 0 as a timeout, but only once it returns, so a "
        "call that never returns stalls the run.",
    )


class RewardConfig(_Strict):
    """How responses are scored."""

    functions: list[RewardFunctionSpec] = Field(
        default_factory=lambda: [RewardFunctionSpec(name="math_accuracy")],
        max_length=64,
        description="Rule-based rewards, summed with their weights.",
    )
    timeout_s: float = Field(
        10.0, gt=0, le=3_600, description="Time limit per response for each function."
    )
    reward_model: ModelLocation | None = Field(
        None, description="Optional reward-model folder scored in addition."
    )


class ParallelConfig(_Strict):
    """Training layout. The inference layout is `rollout.tensor_parallel_size`."""

    tensor_parallel_size: int = Field(
        1, gt=0, le=MAX_PARALLEL, description="Training tensor-parallel size.")
    pipeline_parallel_size: int = Field(
        1, gt=0, le=MAX_PARALLEL, description="Training pipeline-parallel size.")
    context_parallel_size: int = Field(
        1,
        gt=0,
        le=MAX_PARALLEL,
        description="Context-parallel size: each sequence is split over this many devices."
    )
    context_parallel_algo: Literal["ulysses", "ring"] = Field(
        "ulysses",
        description="Context-parallel algorithm: all-to-all over heads, or ring attention.",
    )
    data_parallel_size: int | None = Field(
        None,
        gt=0,
        le=MAX_DEVICES,
        description="Null derives it: devices / (tensor × pipeline × context parallel)."
    )
    colocate_actor_rollout: bool = Field(
        True,
        description="Actor and rollout share devices, switching between training and generation.",
    )
    resharding: Literal["auto", "none"] = Field(
        "auto",
        description="`auto` reshards weights between training and inference layouts; `none` "
        "requires identical layouts.",
    )


class ResourcesConfig(_Strict):
    """What the run asks the scheduler for."""

    device_type: DeviceType = Field("cpu", description="Accelerator kind: npu, gpu or cpu.")
    num_nodes: int = Field(1, gt=0, le=MAX_NODES, description="Machines.")
    devices_per_node: int = Field(
        1,
        gt=0,
        le=MAX_DEVICES_PER_NODE,
        description="Devices per machine (on cpu: training processes per machine)."
    )
    cpus_per_device: int = Field(1, gt=0, le=1_024, description="CPU cores reserved per device.")
    memory_gb: float | None = Field(
        None, gt=0, le=65_536, description="Host memory per node in GiB, reserved as Ray's "
        "`memory` resource (an equal share per device) and checked against the nodes' memory at "
        "submit; null: no request."
    )


class TrainerConfig(_Strict):
    """The training loop: length, checkpoints, evaluation, logging."""

    total_epochs: int = Field(
        1, gt=0, le=MAX_EPOCHS, description="Passes over the training prompts."
    )
    total_steps: int | None = Field(
        None,
        gt=0,
        le=MAX_STEPS, description="Stop after this many steps; overrides `total_epochs` when set."
    )
    save_every: int = Field(
        0,
        ge=0,
        le=MAX_STEPS, description="Save a checkpoint every N steps; 0 saves only the final one."
    )
    eval_every: int = Field(
        0, ge=0, le=MAX_STEPS, description="Evaluate every N steps; 0 disables evaluation.")
    log_every: int = Field(1, gt=0, le=MAX_STEPS, description="Log metrics every N steps.")
    resume_mode: Literal["auto", "disable", "resume_path"] = Field(
        "auto",
        description="`auto` resumes from the latest checkpoint in `output_dir`; `disable` starts "
        "fresh; `resume_path` loads `resume_path`.",
    )
    resume_path: str | None = Field(
        None, description="Checkpoint folder for `resume_mode: resume_path`."
    )
    deterministic: bool = Field(
        False,
        description="Bitwise-reproducible steps: deterministic kernels, the run's seed in every "
        "process, and the determinism variables of cuBLAS, HCCL, LCCL and NCCL; what every "
        "process set is stored with the run (`determinism/report.json`, shown on its page).",
    )
    output_dir: str = Field(
        "outputs", min_length=1, description="Where checkpoints, profiles and precision dumps go."
    )
    project_name: str | None = Field(None, description="Tracking project name.")
    experiment_name: str | None = Field(None, description="Tracking experiment name.")
    logger: list[Literal["console", "mlflow"]] = Field(
        default_factory=lambda: ["console"], description="Where metrics are reported."
    )


PROFILED_STAGES = ("rollout", "reward", "ref_logprob", "old_logprob", "values", "update",
                   "weight_sync")  # the stages a role times (`tools.profiling.stages`)


class ProfilingConfig(_Strict):
    """Profiler traces of chosen steps, stages and ranks (torch.profiler on cpu and cuda,
    torch_npu's profiler on npu): one trace per stage call, under the run's output and in
    MLflow."""

    enable: bool = Field(False, description="Record profiler traces.")
    steps: list[Annotated[int, Field(gt=0, le=MAX_STEPS)]] = Field(
        default_factory=lambda: [2], min_length=1, max_length=MAX_LIST,
        description="Steps to profile (1-based; the first step includes one-off warm-up).",
    )
    ranks: list[Annotated[int, Field(ge=0, lt=MAX_DEVICES)]] = Field(
        default_factory=lambda: [0], min_length=1, max_length=MAX_LIST,
        description="Ranks to profile, within each role (the actor's, reference's, critic's "
        "and reward workers' ranks).",
    )
    stages: list[Literal[PROFILED_STAGES]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(PROFILED_STAGES), min_length=1, max_length=MAX_LIST,
        description="Stages to trace: " + ", ".join(f"`{s}`" for s in PROFILED_STAGES) + ".",
    )
    level: Literal["level0", "level1", "level2"] = Field(
        "level0",
        description="Detail: `level0` the operator timeline; `level1` adds operator shapes and "
        "FLOPs (on npu torch_npu's Level1: AscendCL, AI Core metrics, communication); `level2` "
        "adds Python call stacks and memory (npu: Level2, runtime and AI CPU data).",
    )
    with_stack: bool = Field(False, description="Record Python call stacks (any level).")
    record_shapes: bool = Field(False, description="Record operator input shapes (any level).")
    with_memory: bool = Field(
        False, description="Record tensor allocations and frees (the profiler's memory view)."
    )
    output: str = Field("profiles", min_length=1, description="Folder under `trainer.output_dir`.")


PRECISION_STAGES = ("rollout", "reward", "ref_logprob", "old_logprob", "values", "advantages",
                    "update")  # the stages a precision dump records (`tools.precision.stages`)


class PrecisionConfig(_Strict):
    """Precision dumps of chosen steps, stages and ranks, in msprobe's format (Ascend's
    precision tool), for comparing runs, devices or releases: `python -m rl_core precision
    compare A B` or the web UI's precision comparison finds the first stage and module where
    two runs part."""

    enable: bool = Field(False, description="Dump the chosen steps' stage data and module "
                         "statistics.")
    steps: list[Annotated[int, Field(gt=0, le=MAX_STEPS)]] = Field(
        default_factory=lambda: [1], min_length=1, max_length=MAX_LIST,
        description="Steps to dump (1-based).",
    )
    ranks: list[Annotated[int, Field(ge=0, lt=MAX_DEVICES)]] = Field(
        default_factory=lambda: [0], min_length=1, max_length=MAX_LIST,
        description="Ranks whose modules are dumped, within each role (the stage data is the "
        "whole batch's, dumped once).",
    )
    stages: list[Literal[PRECISION_STAGES]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(PRECISION_STAGES), min_length=1, max_length=MAX_LIST,
        description="Stages to dump: the data of each (`rollout`: prompts, responses and their "
        "log-probs; `reward`: scores; `ref_logprob`, `old_logprob`, `values`: their outputs; "
        "`advantages`: token rewards, advantages, returns; `update`: the losses) and, for "
        "`ref_logprob`, `old_logprob`, `values` and `update`, the forward and backward "
        "statistics of every module of the stage's model.",
    )
    mode: Literal["statistics", "tensor"] = Field(
        "statistics",
        description="`statistics`: max, min, mean and L2 norm of each module's inputs, "
        "outputs and gradients; `tensor`: the full tensors too (large: choose `modules`).",
    )
    modules: list[str] = Field(
        default_factory=list,
        max_length=MAX_LIST,
        description="Dump only modules whose name (path or class) contains one of these, e.g. "
        "`layers.0.`; empty: all.",
    )
    output: str = Field("precision", min_length=1, description="Folder under `trainer.output_dir`.")


class MonitorConfig(_Strict):
    """Device health metrics logged with the training metrics, and samples of the rollouts."""

    log_memory: bool = Field(
        True, description="Log each role's allocated and peak device memory every step "
        "(`memory/<role>/allocated_gb`, `memory/<role>/peak_gb`) and the peak of each of its "
        "stages (`memory/actor/rollout/peak_gb`, `.../update/peak_gb`, `.../weight_sync/peak_gb`, "
        "`memory/reference/ref_logprob/peak_gb`, ...); the largest over the ranks; on CPU each "
        "process's resident set."
    )
    sample_every: int | None = Field(
        None, ge=0, lt=MAX_INT, description="Every this many steps (and at the first), log a "
        "table of rollout samples (prompt, response, reward, each reward function's score) as "
        "the MLflow table artifact `samples/step_<N>.json` (also in the output folder), shown by "
        "the run page's sample viewer; 0 logs none; null: every 10 steps for GRPO, DAPO and PPO "
        "(DPO's pairs have no rewards to show: it logs none and refuses a number above 0)."
    )
    num_samples: int = Field(
        4, ge=1, le=64, description="Responses in each sample table: the first response of "
        "each of the step's first prompts."
    )
    system_metrics_interval: float = Field(
        10.0, ge=0, le=3600, description="Seconds between samples of the resources of the node "
        "that runs the training controller: CPU and memory use, disk and network, and on NVIDIA "
        "GPUs (with nvidia-ml-py, the `cuda` extra) each GPU's utilisation, memory and power, "
        "logged to the run's MLflow run as MLflow's system metrics "
        "(`system/cpu_utilization_percentage`, `system/gpu_0_utilization_percentage`, ...: "
        "MLflow's System metrics tab, the run page's Resources charts). 0 turns it off; "
        "otherwise at least 0.1. Needs MLFLOW_TRACKING_URI (nothing is sampled without "
        "MLflow). Ascend NPUs are not sampled (MLflow has no NPU monitor), and on a cluster of "
        "several nodes only the controller's node is."
    )


class ToolsConfig(_Strict):
    """Profiling, precision dumps and monitoring."""

    profiling: ProfilingConfig = Field(
        default_factory=ProfilingConfig, description="Profiler traces."
    )
    precision: PrecisionConfig = Field(
        default_factory=PrecisionConfig, description="Precision dumps."
    )
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Device monitoring.")


# --------------------------------------------------------------------------- not implemented yet
# Fields that the schema describes but no code builds beyond the values listed: dotted path ->
# the only values accepted today. A spec that sets another value is refused at that field before
# the cross-field rules run; the reference and the JSON Schema mark each of these fields. An
# entry goes when its feature lands.
NOT_IMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "rollout.tensor_parallel_size": (1,),
    "reward.reward_model": (None,),
    "parallel.tensor_parallel_size": (1,),
    "parallel.pipeline_parallel_size": (1,),
    "parallel.context_parallel_size": (1,),
    "parallel.context_parallel_algo": ("ulysses",),  # moot while context_parallel_size is 1
    "parallel.colocate_actor_rollout": (True,),  # rollout generates in the training process
    "parallel.resharding": ("auto",),  # one layout for training and inference: nothing to reshard
}


def not_implemented_note(path: str) -> str | None:
    """The note `not implemented yet (only X)` of a field in NOT_IMPLEMENTED; None for others."""
    allowed = NOT_IMPLEMENTED.get(path)
    if allowed is None:
        return None
    return f"not implemented yet (only {' or '.join(_shown(value) for value in allowed)})"


def _shown(value: Any) -> str:
    """A value as it is written in YAML: text bare, anything else as JSON (true, null, [2])."""
    return value if isinstance(value, str) else json.dumps(to_jsonable_python(value))


def _refusals(spec: BaseModel) -> list[Violation]:
    """(path, message) for each field of `spec` set to a value that is not implemented yet."""
    refused = []
    for path, allowed in NOT_IMPLEMENTED.items():
        value: Any = spec
        for part in path.split("."):
            value = getattr(value, part)
        if value not in allowed:
            note = not_implemented_note(path)
            refused.append((path, f"{_shown(value)} is {note}; see docs/run-spec.md"))
    return refused


# --------------------------------------------------------------------------- the spec


class SpecRuleViolation(ValueError):
    """Raised by the `RunSpec` validator with every broken cross-field rule."""

    def __init__(self, violations: list[Violation]):
        self.violations = violations
        super().__init__("\n".join(f"{field}: {message}" for field, message in violations))


class RunSpec(_Strict):
    """Everything needed to start an RL post-training run."""

    algorithm: Algorithm = Field("grpo", description="grpo, dapo, ppo or dpo; selects the preset.")
    name: str | None = Field(None, max_length=128,
                             description="Free-form run name: one line of plain text.")
    seed: int = Field(1234, ge=0, lt=MAX_INT, description="Seed of every random generator.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompts and batching.")
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="Response generation."
    )
    actor: ActorConfig = Field(default_factory=ActorConfig, description="Policy update.")
    advantage: AdvantageConfig = Field(
        default_factory=AdvantageConfig, description="Advantages and reward shaping."
    )
    dpo: DPOConfig = Field(default_factory=DPOConfig, description="DPO loss.")
    reference: ReferenceConfig = Field(
        default_factory=ReferenceConfig, description="Reference policy."
    )
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value model.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Scoring.")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig, description="Parallel layout.")
    resources: ResourcesConfig = Field(
        default_factory=ResourcesConfig, description="Devices requested."
    )
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Training loop.")
    tools: ToolsConfig = Field(
        default_factory=ToolsConfig, description="Profiling, precision, monitoring."
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str | None) -> str | None:
        problem = plain_text_problem(name) if name else None
        if problem:
            raise ValueError(problem)
        return name

    @model_validator(mode="after")
    def _check_rules(self) -> RunSpec:
        # A value that is not implemented yet is reported alone: rules about it would only confuse.
        violations = _refusals(self) or [v for rule in _RULES for v in rule(self)]
        if violations:
            raise SpecRuleViolation(violations)
        return self

    @property
    def world_size(self) -> int:
        """Devices in the run."""
        return self.resources.num_nodes * self.resources.devices_per_node

    @property
    def model_parallel_size(self) -> int:
        """Devices holding one copy of the model: tensor × pipeline × context parallel."""
        p = self.parallel
        return p.tensor_parallel_size * p.pipeline_parallel_size * p.context_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """Model replicas: `parallel.data_parallel_size`, or derived from the device count."""
        return self.parallel.data_parallel_size or self.world_size // self.model_parallel_size

    def device_request(self) -> dict[str, Any]:
        """What the scheduler must find for this run."""
        return {
            "device_type": self.resources.device_type,
            "device_count": self.world_size,
            "num_nodes": self.resources.num_nodes,
            "devices_per_node": self.resources.devices_per_node,
        }

    def to_yaml(self) -> str:
        """The resolved spec as YAML, in declaration order; it resolves back to an equal spec."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, allow_unicode=True)

    def flat_params(self) -> dict[str, str]:
        """Every leaf as `dotted.key -> text` (list items by index), for MLflow params."""
        return flatten_params(self.model_dump(mode="json"))


def flatten_params(value: Any, prefix: str = "") -> dict[str, str]:
    """Leaves of nested dicts and lists as dotted keys; non-text values as JSON."""
    if isinstance(value, dict) and value:
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list) and value:
        items = enumerate(value)
    else:
        return {prefix: value if isinstance(value, str) else json.dumps(value)}
    flat: dict[str, str] = {}
    for key, item in items:
        flat.update(flatten_params(item, f"{prefix}.{key}" if prefix else str(key)))
    return flat


# --------------------------------------------------------------------------- cross-field rules
# Each rule yields (field path, message); its docstring is listed in the generated reference.


def _rule_clip_ratios(s: RunSpec) -> Iterator[Violation]:
    """`actor.clip_ratio_low` ≤ `actor.clip_ratio_high`."""
    low, high = s.actor.clip_ratio_low, s.actor.clip_ratio_high
    if low > high:
        yield (
            "actor.clip_ratio_low",
            f"clip_ratio_low ({low}) must be <= clip_ratio_high ({high}): "
            "lower actor.clip_ratio_low or raise actor.clip_ratio_high",
        )


def _rule_data_source(s: RunSpec) -> Iterator[Violation]:
    """Exactly one of `data.train_files` and `data.synthetic`, a synthetic task with as many
    distinct problems as it asks for; DPO files need `chosen_key` and `rejected_key`."""
    d = s.data
    if not d.train_files and d.synthetic is None:
        yield "data.train_files", "no training data: set data.train_files or data.synthetic"
    if d.train_files and d.synthetic is not None:
        yield "data.synthetic", "data.train_files and data.synthetic are both set: remove one"
    g = d.synthetic
    if g is not None and g.task in ("addition", "multiplication"):
        space = (10**g.digits) ** 2  # operands 0 .. 10**digits - 1 (rl_core.data.synthetic)
        if g.num_train + g.num_val > space:
            yield (
                "data.synthetic.num_train",
                f"only {space} distinct {g.digits}-digit {g.task} problems exist, and "
                f"num_train + num_val = {g.num_train} + {g.num_val} = "
                f"{g.num_train + g.num_val} distinct ones are asked for: lower them or raise "
                "data.synthetic.digits",
            )
    if s.algorithm == "dpo" and d.train_files:
        for key in ("chosen_key", "rejected_key"):
            if getattr(d, key) is None:
                yield (
                    f"data.{key}",
                    f"DPO reads preference pairs from the files: set data.{key} "
                    "to the record field that holds it",
                )


def _rule_algorithm(s: RunSpec) -> Iterator[Violation]:
    """PPO needs `critic.enable` and `adv_estimator: gae`, which no other algorithm may use; DPO
    has no estimator."""
    alg, est = s.algorithm, s.advantage.adv_estimator
    if alg == "ppo":
        if not s.critic.enable:
            yield "critic.enable", "PPO trains a value model: set critic.enable=true"
        if est != "gae":
            yield (
                "advantage.adv_estimator",
                "PPO uses GAE advantages: set advantage.adv_estimator=gae",
            )
        return
    if s.critic.enable:
        yield "critic.enable", f"only PPO uses a critic, this is {alg}: set critic.enable=false"
    if alg == "dpo":
        if est is not None:
            yield (
                "advantage.adv_estimator",
                "DPO has no advantage estimator: set advantage.adv_estimator=null",
            )
        if s.actor.use_dynamic_bsz:  # a token budget would part a chosen row from its pair
            yield (
                "actor.use_dynamic_bsz",
                "DPO's loss needs each (chosen, rejected) pair in one micro-batch, which a token "
                "budget does not keep: set actor.use_dynamic_bsz=false and size micro-batches "
                "with actor.ppo_micro_batch_size",
            )
    elif est is None:
        yield (
            "advantage.adv_estimator",
            f"{alg} needs an advantage estimator: set advantage.adv_estimator=grpo",
        )
    elif est == "gae":
        yield (
            "advantage.adv_estimator",
            "gae needs the critic that only PPO trains: set algorithm=ppo, or pick another "
            "advantage.adv_estimator (grpo, rloo, ...)",
        )


def _rule_reference(s: RunSpec) -> Iterator[Violation]:
    """DAPO has no reference model and no KL terms; KL terms and DPO need `reference.enable`."""
    ref = s.reference.enable
    kl_terms = (
        ("actor.use_kl_loss", s.actor.use_kl_loss, "the KL loss"),
        ("advantage.use_kl_in_reward", s.advantage.use_kl_in_reward, "the in-reward KL penalty"),
    )
    if s.algorithm == "dapo":
        if ref:
            yield "reference.enable", "DAPO drops the reference model: set reference.enable=false"
        for path, on, what in kl_terms:
            if on:
                yield path, f"DAPO drops {what}: set {path}=false"
        return
    for path, on, what in kl_terms:
        if on and not ref:
            yield (
                path,
                f"{what} needs the reference model: set reference.enable=true or {path}=false",
            )
    if s.algorithm == "dpo" and not ref:
        yield (
            "reference.enable",
            "DPO compares against the reference model: set reference.enable=true",
        )


def _rule_groups(s: RunSpec) -> Iterator[Violation]:
    """Group estimators (grpo, dr_grpo, rloo, reinforce_plus_plus_baseline) and dynamic sampling
    need ≥ 2 sampled responses per prompt."""
    n, est = s.rollout.n_samples_per_prompt, s.advantage.adv_estimator
    if est in GROUP_ESTIMATORS:
        if n < 2:
            yield (
                "rollout.n_samples_per_prompt",
                f"{est} compares the responses to the same prompt: "
                f"set rollout.n_samples_per_prompt >= 2 (it is {n})",
            )
        if not s.rollout.do_sample:
            yield (
                "rollout.do_sample",
                f"greedy decoding makes the responses to a prompt identical, so {est} "
                "advantages are all zero: set rollout.do_sample=true",
            )
    if s.advantage.dynamic_sampling.enable and n < 2:
        yield (
            "advantage.dynamic_sampling.enable",
            "dynamic sampling filters groups of responses: set rollout.n_samples_per_prompt >= 2 "
            "or advantage.dynamic_sampling.enable=false",
        )


def _rule_batch_sizes(s: RunSpec) -> Iterator[Violation]:
    """Devices divide by tensor × pipeline × context parallel and by
    `rollout.tensor_parallel_size`; `data.train_batch_size` divides by the data-parallel size and
    by `actor.ppo_mini_batch_size`; a rank's share of a mini-batch divides by the micro-batch
    sizes."""
    world, mp = s.world_size, s.model_parallel_size
    if world % mp:
        yield (
            "parallel",
            f"{world} devices (resources.num_nodes × resources.devices_per_node) do not split into "
            f"groups of tensor × pipeline × context parallel = {mp}: change the parallel sizes or "
            "the device count",
        )
        return
    dp = world // mp
    if s.parallel.data_parallel_size not in (None, dp):
        yield (
            "parallel.data_parallel_size",
            f"data_parallel_size ({s.parallel.data_parallel_size}) must equal devices / "
            f"(tensor × pipeline × context parallel) = {dp}: set it to {dp} or null",
        )
    if world % s.rollout.tensor_parallel_size:
        yield (
            "rollout.tensor_parallel_size",
            f"{world} devices do not split into inference groups of "
            f"{s.rollout.tensor_parallel_size}: use a divisor of {world}",
        )
    batch, mini, n = (
        s.data.train_batch_size,
        s.actor.ppo_mini_batch_size,
        s.rollout.n_samples_per_prompt,
    )
    if batch % dp:
        yield (
            "data.train_batch_size",
            f"train_batch_size ({batch}) must be divisible by the data-parallel size ({dp}): "
            f"use a multiple of {dp}",
        )
    if batch % mini:
        yield (
            "actor.ppo_mini_batch_size",
            f"data.train_batch_size ({batch}) must be divisible by actor.ppo_mini_batch_size "
            f"({mini}): pick a divisor of {batch}",
        )
    if (mini * n) % dp:
        yield (
            "actor.ppo_mini_batch_size",
            f"a mini-batch of {mini} prompts × {n} responses = {mini * n} must split over the "
            f"data-parallel size ({dp}): change actor.ppo_mini_batch_size",
        )
    elif not s.actor.use_dynamic_bsz:
        per_rank = mini * n // dp
        micro = [("actor.ppo_micro_batch_size", s.actor.ppo_micro_batch_size)]
        if s.critic.enable:
            micro.append(("critic.ppo_micro_batch_size", s.critic.ppo_micro_batch_size))
        for path, size in micro:
            if per_rank % size:
                yield (
                    path,
                    f"each data-parallel rank updates on {per_rank} responses per mini-batch, "
                    f"which {path} ({size}) must divide: pick a divisor of {per_rank}",
                )


def _rule_layouts(s: RunSpec) -> Iterator[Violation]:
    """`parallel.resharding: none` needs the same training and inference layout."""
    p = s.parallel
    if p.resharding == "none" and (
        s.rollout.tensor_parallel_size != p.tensor_parallel_size or p.pipeline_parallel_size > 1
    ):
        yield (
            "parallel.resharding",
            "resharding=none needs identical training and inference layouts: set "
            "rollout.tensor_parallel_size = parallel.tensor_parallel_size and "
            "parallel.pipeline_parallel_size=1, or parallel.resharding=auto",
        )


def _rule_lengths(s: RunSpec) -> Iterator[Violation]:
    """`actor.max_token_len_per_gpu` fits one sequence; the overlong buffer is shorter than, and
    partial-rollout splits divide, `rollout.max_new_tokens`."""
    seq = s.data.max_prompt_length + s.rollout.max_new_tokens
    budget = s.actor.max_token_len_per_gpu * s.parallel.context_parallel_size
    if s.actor.use_dynamic_bsz and budget < seq:
        yield (
            "actor.max_token_len_per_gpu",
            f"a sequence can be max_prompt_length + max_new_tokens = {seq} tokens, more than "
            f"max_token_len_per_gpu × context_parallel_size = {budget}: raise "
            "actor.max_token_len_per_gpu",
        )
    buffer = s.advantage.overlong_buffer
    if buffer.enable and buffer.len >= s.rollout.max_new_tokens:
        yield (
            "advantage.overlong_buffer.len",
            f"the overlong buffer ({buffer.len}) must be shorter than rollout.max_new_tokens "
            f"({s.rollout.max_new_tokens}): lower advantage.overlong_buffer.len",
        )
    split = s.rollout.partial_rollout_max_split
    if split > 1 and s.rollout.max_new_tokens % split:
        yield (
            "rollout.partial_rollout_max_split",
            f"rollout.max_new_tokens ({s.rollout.max_new_tokens}) must be divisible by "
            f"partial_rollout_max_split ({split}): change either",
        )


def _rule_partial_rollout(s: RunSpec) -> Iterator[Violation]:
    """`rollout.partial_rollout_max_age` only with partial rollout; partial rollout neither
    with DAPO dynamic sampling nor for DPO."""
    r = s.rollout
    if r.partial_rollout_max_split <= 1:
        if r.partial_rollout_max_age is not None:
            yield ("rollout.partial_rollout_max_age", "applies only with partial rollout: set "
                   "rollout.partial_rollout_max_split > 1 or remove it")
        return
    if s.advantage.dynamic_sampling.enable:
        yield ("rollout.partial_rollout_max_split", "dynamic sampling draws whole generation "
               "batches and keeps the groups whose rewards differ, partial rollout trains groups "
               "as their responses finish: set advantage.dynamic_sampling.enable=false or "
               "rollout.partial_rollout_max_split=0")
    if s.algorithm == "dpo":
        yield ("rollout.partial_rollout_max_split", "DPO makes its pairs from one step's "
               "whole responses: set it to 0 (partial rollout is for grpo, dapo and ppo)")


def _rule_reward(s: RunSpec) -> Iterator[Violation]:
    """GRPO, DAPO and PPO need `reward.functions`."""
    if s.algorithm != "dpo" and not s.reward.functions and s.reward.reward_model is None:
        yield "reward.functions", f"{s.algorithm} needs a reward: add reward.functions"


def _rule_trainer(s: RunSpec) -> Iterator[Violation]:
    """`trainer.resume_path` goes with `resume_mode: resume_path`; `eval_every` needs validation
    data."""
    t = s.trainer
    if t.resume_mode == "resume_path" and t.resume_path is None:
        yield (
            "trainer.resume_path",
            "resume_mode=resume_path needs trainer.resume_path: set it or use resume_mode=auto",
        )
    if t.resume_mode != "resume_path" and t.resume_path is not None:
        yield (
            "trainer.resume_path",
            f"resume_path is only read with resume_mode=resume_path (it is {t.resume_mode}): "
            "set trainer.resume_mode=resume_path or remove trainer.resume_path",
        )
    synthetic_val = s.data.synthetic is not None and s.data.synthetic.num_val > 0
    if t.eval_every and not (s.data.val_files or synthetic_val):
        yield (
            "trainer.eval_every",
            "evaluation needs validation data: set data.val_files or trainer.eval_every=0",
        )


def _rule_offload(s: RunSpec) -> Iterator[Violation]:
    """`actor.offload.*` moves training state from an accelerator to host memory: not on cpu,
    where it already is; parameters only with fsdp2 (the plain engine's are the rollout's)."""
    offload = s.actor.offload
    asked = [name for name in ("param", "optimizer") if getattr(offload, name)]
    if asked and s.resources.device_type == "cpu":
        for name in asked:
            yield (f"actor.offload.{name}", "on cpu the training state is in host memory "
                   "already: offload is for npu and cuda devices; set it to false")
        return
    if offload.param and s.actor.strategy != "fsdp2":
        yield ("actor.offload.param", "needs actor.strategy=fsdp2 (the plain engine's parameters "
               "are the rollout's weights, on the device throughout); or use "
               "actor.offload.optimizer alone")


def _rule_rollout_engine(s: RunSpec) -> Iterator[Violation]:
    """vLLM's settings only with `rollout.engine: vllm`; its memory share only on accelerators;
    its length fits a prompt and a response; the IS cap only with IS on."""
    r = s.rollout
    defaults = RolloutConfig()
    if r.engine != "vllm":
        for name in ("gpu_memory_utilization", "max_model_len"):
            if getattr(r, name) != getattr(defaults, name):
                yield (f"rollout.{name}", "is a vLLM setting: set rollout.engine=vllm or remove it")
    elif (s.resources.device_type == "cpu"
          and r.gpu_memory_utilization != defaults.gpu_memory_utilization):
        yield ("rollout.gpu_memory_utilization", "on cpu vLLM's KV cache is sized for its "
               "longest sequences, not a fraction of memory: remove it (it applies to npu, cuda)")
    seq = s.data.max_prompt_length + r.max_new_tokens
    if r.max_model_len is not None and r.max_model_len < seq:
        yield ("rollout.max_model_len", f"{r.max_model_len} is shorter than "
               f"data.max_prompt_length + rollout.max_new_tokens = {seq}: raise it or remove it")
    if s.actor.rollout_is == "off" and s.actor.rollout_is_cap != ActorConfig().rollout_is_cap:
        yield ("actor.rollout_is_cap", "applies only with actor.rollout_is=token or sequence")


_MSPROBE_PATH = re.compile(r"^[A-Za-z0-9_.:/-]+$")  # what msprobe accepts as a dump path


def _rule_tools(s: RunSpec) -> Iterator[Violation]:
    """Profiled and dumped steps within the run, ranks within its devices; dump folders that
    msprobe can write to; rollout samples only where there are rollouts with rewards."""
    total = s.trainer.total_steps
    if s.algorithm == "dpo" and s.tools.monitor.sample_every:
        yield ("tools.monitor.sample_every", "DPO logs no rollout samples (its pairs have no "
               "rewards): remove it or set tools.monitor.sample_every=0")
    if 0 < s.tools.monitor.system_metrics_interval < 0.1:
        yield ("tools.monitor.system_metrics_interval", f"{s.tools.monitor.system_metrics_interval}"
               " s is too often to sample the node: use 0 (off) or at least 0.1")
    for name in ("profiling", "precision"):
        tool = getattr(s.tools, name)
        if not tool.enable:
            continue
        late = sorted(step for step in tool.steps if total and step > total)
        if late:
            yield (f"tools.{name}.steps", f"steps {late} come after the last step "
                   f"(trainer.total_steps={total}): choose steps in 1..{total}")
        beyond = sorted(rank for rank in tool.ranks if rank >= s.world_size)
        if beyond:
            yield (f"tools.{name}.ranks", f"ranks {beyond} do not exist: the run has "
                   f"{s.world_size} device(s), ranks 0..{s.world_size - 1}")
    precision = s.tools.precision
    if precision.enable:
        for field, path in (("trainer.output_dir", s.trainer.output_dir),
                            ("tools.precision.output", precision.output)):
            if not _MSPROBE_PATH.match(path):
                yield (field, f"{path!r}: msprobe writes precision dumps only to paths of "
                       "letters, digits and _ . : / - (no spaces): choose another folder")


_RULES: tuple[Callable[[RunSpec], Iterator[Violation]], ...] = (
    _rule_clip_ratios,
    _rule_data_source,
    _rule_algorithm,
    _rule_reference,
    _rule_groups,
    _rule_batch_sizes,
    _rule_layouts,
    _rule_lengths,
    _rule_partial_rollout,
    _rule_reward,
    _rule_trainer,
    _rule_offload,
    _rule_rollout_engine,
    _rule_tools,
)


# --------------------------------------------------------------------------- presets

PRESETS: dict[str, dict[str, Any]] = {
    "grpo": {
        "advantage": {"adv_estimator": "grpo"},
        "actor": {"use_kl_loss": True, "kl_loss_type": "low_var_kl", "kl_loss_coef": 0.001},
        "reference": {"enable": True},
        "critic": {"enable": False},
        "rollout": {"n_samples_per_prompt": 4},
    },
    "dapo": {
        "advantage": {
            "adv_estimator": "grpo",
            "overlong_buffer": {"enable": True},
            "dynamic_sampling": {"enable": True},
        },
        "actor": {
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.28,
            "loss_agg_mode": "token-mean",
            "use_kl_loss": False,
        },
        "reference": {"enable": False},
        "critic": {"enable": False},
        "rollout": {"n_samples_per_prompt": 4},
    },
    "ppo": {
        "advantage": {"adv_estimator": "gae"},
        "actor": {"use_kl_loss": False},
        "reference": {"enable": False},
        "critic": {"enable": True},
        "rollout": {"n_samples_per_prompt": 1},
    },
    "dpo": {
        "advantage": {"adv_estimator": None},
        "actor": {"use_kl_loss": False},
        "dpo": {"beta": 0.1, "loss_type": "sigmoid"},
        "reference": {"enable": True},
        "critic": {"enable": False},
        "rollout": {"n_samples_per_prompt": 2},
    },
}


# --------------------------------------------------------------------------- errors


class SpecError(InputError):
    """A spec that cannot be resolved; `errors` lists `{"field": dotted path, "message": ...}`.

    `field` is "" for problems with the whole spec (YAML syntax, a malformed override).
    """

    def __init__(self, errors: list[dict[str, str]]):
        self.errors = errors
        super().__init__(
            "\n".join(
                f"{e['field']}: {e['message']}" if e["field"] else e["message"] for e in errors
            )
        )

    @classmethod
    def single(cls, field: str, message: str) -> SpecError:
        return cls([{"field": field, "message": message}])

    @classmethod
    def from_validation_error(cls, exc: ValidationError) -> SpecError:
        errors: list[dict[str, str]] = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            prefix = ".".join(str(part) for part in loc)
            cause = err.get("ctx", {}).get("error")
            if isinstance(cause, SpecRuleViolation):
                errors += [
                    {"field": f"{prefix}.{field}" if prefix else field, "message": message}
                    for field, message in cause.violations
                ]
                continue
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message += _unknown_key_hint(loc)
            errors.append({"field": prefix, "message": message})
        return cls(errors)


def _unknown_key_hint(loc: tuple[Any, ...]) -> str:
    known = _known_keys(loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    if close:
        return f": unknown key, did you mean {close[0]!r}?"
    return f": unknown key, expected one of {', '.join(known)}" if known else ": unknown key"


def _known_keys(parent: tuple[Any, ...]) -> list[str]:
    """Field names of the model found at `parent` (a pydantic loc) inside RunSpec."""
    tp: Any = RunSpec
    for part in parent:
        tp = _without_none(tp)
        if isinstance(part, int) and get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif _is_model(tp) and part in tp.model_fields:
            tp = tp.model_fields[part].annotation
        else:
            return []
    tp = _without_none(tp)
    return list(tp.model_fields) if _is_model(tp) else []


def _is_model(tp: Any) -> bool:
    return get_origin(tp) is None and isinstance(tp, type) and issubclass(tp, BaseModel)


def _without_none(tp: Any) -> Any:
    """`X | None` -> X; anything else unchanged."""
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


# --------------------------------------------------------------------------- resolution


def apply_overrides(raw: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A deep copy of `raw` with each `dotted.key=value` applied; values are parsed as YAML."""
    data = copy.deepcopy(dict(raw))
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise SpecError.single(
                "",
                f"override {item!r} must look like dotted.key=value "
                "(e.g. rollout.n_samples_per_prompt=8)",
            )
        try:
            value, _ = _read_yaml(text)
        except _YAMLProblem as exc:
            verdict = "is not accepted" if exc.refused else "is not valid YAML"
            raise SpecError.single(
                ".".join(parts), f"override value {_short(text)} {verdict}: {exc}"
            ) from exc
        _set_dotted(data, parts, value)
    return data


def override_refusal(item: str) -> str | None:
    """Why the value of a `dotted.key=value` override is refused (an anchor, alias or tag, too
    long or too deep), or None; a malformed key or a YAML syntax error is `apply_overrides`'s to
    report at the field."""
    _, sep, text = item.partition("=")
    try:
        value = _read_yaml(text)[0] if sep else None
    except _YAMLProblem as exc:
        return f"override value {_short(text)} is not accepted: {exc}" if exc.refused else None
    problem = _scan(value, MAX_SPEC_DEPTH, MAX_SPEC_NODES)
    return f"override value {_short(text)}: {problem[1]}" if problem else None


def _short(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _set_dotted(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, dict):
            if last:
                node[part] = value
            elif node.get(part) is None:
                node[part] = {}
            node = node[part]
        elif isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise SpecError.single(
                    ".".join(parts[: i + 1]),
                    f"override: {part!r} is not an index of this list of {len(node)} items",
                )
            if last:
                node[int(part)] = value
            node = node[int(part)]
        else:
            parent = ".".join(parts[:i])
            raise SpecError.single(
                parent, f"override: {parent} is a {type(node).__name__}, not a section"
            )


def _deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`base` updated by `top`, recursively for mappings; lists and scalars of `top` win whole."""
    merged = copy.deepcopy(dict(base))
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def resolve_spec(raw: Mapping[str, Any], overrides: Sequence[str] = ()) -> RunSpec:
    """Apply `overrides` to `raw`, fill the rest from the algorithm's preset, and validate."""
    if not isinstance(raw, Mapping):
        raise SpecError.single(
            "", f"a run spec is a mapping of sections, not a {type(raw).__name__}"
        )
    check_spec_bounds(raw)
    data = apply_overrides(raw, overrides)
    check_spec_bounds(data)
    algorithm = data.setdefault("algorithm", "grpo")
    if not isinstance(algorithm, str) or algorithm not in PRESETS:
        raise SpecError.single(
            "algorithm", f"unknown algorithm {algorithm!r}: choose one of {', '.join(ALGORITHMS)}"
        )
    merged = _deep_merge(PRESETS[algorithm], data)
    try:
        return RunSpec.model_validate(merged)
    except ValidationError as exc:
        first = SpecError.from_validation_error(exc)
        rules_ran = any(isinstance(e.get("ctx", {}).get("error"), SpecRuleViolation)
                        for e in exc.errors())
        behind = [] if rules_ran else _errors_behind(merged, first.errors)
        raise SpecError(first.errors + behind) from exc


def _errors_behind(data: dict[str, Any], errors: list[dict[str, str]], rounds: int = 3) -> list[dict[str, str]]:
    """The errors that field errors hide (pydantic checks the rules of a whole spec only once
    every field is valid): with the fields in error left out (their defaults taken), the spec is
    checked again, so one answer holds a type error here and a rule broken there."""
    found: list[dict[str, str]] = []
    seen = {e["field"] for e in errors}
    for _ in range(rounds):
        data = copy.deepcopy(data)
        if not [_drop(data, field.split(".")) for field in sorted(seen) if field].count(True):
            return found
        try:
            RunSpec.model_validate(data)
            return found
        except ValidationError as exc:
            new = [e for e in SpecError.from_validation_error(exc).errors if e["field"] not in seen]
        if not new:
            return found
        found += new
        seen |= {e["field"] for e in new}
    return found


def _drop(data: Any, parts: list[str]) -> bool:
    """Remove the value at a dotted error path (a list item takes its whole list along)."""
    node = data
    for i, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            return False
        if i == len(parts) - 1 or not isinstance(node[part], dict):
            del node[part]
            return True
        node = node[part]
    return False


def check_spec_bounds(data: Any) -> None:
    """Refuse a spec (the raw mapping, whatever its source) that is too deep, holds too many
    values or is too large as JSON; the SpecError says the limit."""
    problem = _scan(data, MAX_SPEC_DEPTH, MAX_SPEC_NODES)
    if problem:
        where, message = problem
        raise SpecError.single(where, f"the spec is {message}" if not where else message)
    size = len(json.dumps(data, default=str))
    if size > MAX_SPEC_BYTES:
        raise SpecError.single(
            "",
            f"the spec is {size} bytes as JSON, more than the limit of {MAX_SPEC_BYTES}: shorten "
            "it; large data belongs in files (data.train_files)",
        )


def load_yaml(text: str, source: str = "<spec>") -> Any:
    """The value of one YAML document read by the spec loader (no anchors, aliases or tags,
    bounded length and nesting); a problem raises SpecError naming the line and column."""
    try:
        return _read_yaml(text)[0]
    except _YAMLProblem as exc:
        raise SpecError.single("", f"{source}: {exc}") from exc


def parse_spec_yaml(text: str, source: str = "<spec>") -> dict[str, Any]:
    """The mapping in a YAML document; a syntax error, a refused construct (anchor, alias, tag),
    a non-mapping or a spec beyond the limits raises SpecError (with the line)."""
    try:
        data, node = _read_yaml(text)
    except _YAMLProblem as exc:
        raise SpecError.single("", f"{source}: {exc}") from exc
    if node is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError.single(
            "",
            f"{source}: line {node.start_mark.line + 1}: the top level must be a mapping of "
            f"sections (algorithm:, model:, data:, ...), not a {type(data).__name__}",
        )
    check_spec_bounds(data)
    return data


class _YAMLProblem(ValueError):
    """Why a YAML text was not read; `refused` when it is valid YAML the spec does not accept."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class _Refused(yaml.MarkedYAMLError):
    """A construct the spec loader does not accept (raised while composing)."""


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors, aliases or tags, and with bounded nesting: a spec
    is plain data, and an alias can expand a few bytes into gigabytes."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._refuse(event, f"YAML aliases (*{event.anchor})", "write the value out in full")
        if event.anchor is not None:
            self._refuse(event, f"YAML anchors (&{event.anchor})", "write the value out in full")
        if getattr(event, "tag", None) is not None:
            self._refuse(event, f"YAML tags ({event.tag})", "remove the tag, write a plain value")
        if isinstance(event, yaml.CollectionStartEvent) and self._depth >= MAX_SPEC_DEPTH:
            raise _Refused(
                problem=f"nesting deeper than the limit of {MAX_SPEC_DEPTH} levels is not "
                "accepted in a run spec",
                problem_mark=event.start_mark,
                note="flatten it",
            )
        self._depth += isinstance(event, yaml.CollectionStartEvent)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= isinstance(event, yaml.CollectionStartEvent)

    @staticmethod
    def _refuse(event: yaml.Event, what: str, fix: str) -> None:
        raise _Refused(
            problem=f"{what} are not accepted in a run spec",
            problem_mark=event.start_mark,
            note=fix,
        )


def _read_yaml(text: str) -> tuple[Any, yaml.Node | None]:
    """(value, root node) of one YAML document, read by `_SpecLoader`; raises _YAMLProblem."""
    if len(text) > MAX_YAML_CHARS:
        raise _YAMLProblem(
            f"{len(text)} characters of YAML, more than the limit of {MAX_YAML_CHARS}: shorten "
            "it; large data belongs in files",
            refused=True,
        )
    try:
        loader = _SpecLoader(text)  # its reader refuses control characters at once
    except yaml.YAMLError as exc:
        raise _YAMLProblem(f"YAML error: {exc}") from exc
    try:
        node = loader.get_single_node()
        return (loader.construct_document(node) if node is not None else None), node
    except _Refused as exc:
        message = f"{exc.problem} (at {_position(exc.problem_mark)}): {exc.note}"
        raise _YAMLProblem(message, refused=True) from exc
    except yaml.MarkedYAMLError as exc:
        message = f"YAML syntax error at {_position(exc.problem_mark)}: {exc.problem}"
        if exc.context:
            message += f" ({exc.context} at {_position(exc.context_mark)})"
        raise _YAMLProblem(message) from exc
    except (yaml.YAMLError, ValueError, OverflowError) as exc:
        raise _YAMLProblem(f"YAML error: {exc}") from exc
    finally:
        loader.dispose()


def _position(mark: yaml.Mark | None) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "an unknown position"


def load_spec(path: str | Path, overrides: Sequence[str] = ()) -> RunSpec:
    """Read a YAML spec file and resolve it (see `resolve_spec`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError.single("", f"{path}: cannot read: {exc.strerror or exc}") from exc
    return resolve_spec(parse_spec_yaml(text, str(path)), overrides)


def spec_defaults(algorithm: str = "grpo") -> dict[str, Any]:
    """Every value a spec of `algorithm` gets when it sets nothing (the preset over the field
    defaults, as JSON, list defaults included), without the rules that need a whole spec (a
    spec that sets nothing has no data). What a form shows where the user left a field empty."""
    preset = PRESETS.get(algorithm, {})
    values: dict[str, Any] = {}
    for name, info in RunSpec.model_fields.items():
        kind = info.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            values[name] = kind.model_validate(preset.get(name, {})).model_dump(mode="json")
        else:
            values[name] = preset.get(name, info.get_default(call_default_factory=True))
    values["algorithm"] = algorithm
    return values


def spec_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of RunSpec, for forms and external validation. The
    description of each field in NOT_IMPLEMENTED begins with what is built."""
    schema = RunSpec.model_json_schema()
    for path in NOT_IMPLEMENTED:
        node = schema
        for part in path.split("."):
            node = _schema_object(schema, node)["properties"][part]
        node["description"] = _described(path, node.get("description", ""))
    return schema


def _schema_object(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """The object schema a property refers to (through `$ref`, or `anyOf` with null)."""
    refs = [n["$ref"] for n in (node, *node.get("anyOf", ())) if "$ref" in n]
    return schema["$defs"][refs[0].rsplit("/", 1)[1]] if refs else node


def _described(path: str, description: str) -> str:
    """A field's description, led by its not-implemented note when it has one."""
    note = not_implemented_note(path)
    return f"{note[0].upper()}{note[1:]}. {description}" if note else description


# --------------------------------------------------------------------------- reference docs


def spec_reference_markdown() -> str:
    """Markdown reference of every field, the presets and the cross-field rules."""
    lines = ["## Top level", "", *_table(RunSpec, "", with_sections=False)]
    for name, field in RunSpec.model_fields.items():
        if _is_model(field.annotation):
            lines += ["", f"## `{name}`", "", _summary(field.annotation.__doc__), ""]
            lines += _table(field.annotation, f"{name}.")
    lines += ["", "## Presets", "", "What each algorithm fills in where the spec is silent.", ""]
    for algorithm, preset in PRESETS.items():
        values = ", ".join(f"`{key}: {value}`" for key, value in flatten_params(preset).items())
        lines.append(f"- **{algorithm}**: {values}")
    lines += ["", "## Cross-field rules", ""]
    lines += [f"- {_summary(rule.__doc__)}" for rule in _RULES]
    lines += ["", "## Not implemented yet", "", _NOT_IMPLEMENTED_INTRO, ""]
    lines += [f"- `{path}`: {not_implemented_note(path)}" for path in NOT_IMPLEMENTED]
    return "\n".join(lines) + "\n"


_NOT_IMPLEMENTED_INTRO = (
    "These fields are part of the schema, but only the values listed are built today: a spec "
    "that sets another value is refused at the field (`field: value is not implemented yet "
    "(only ...)`), before the cross-field rules run."
)


def _table(model: type[BaseModel], prefix: str, with_sections: bool = True) -> list[str]:
    header = ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    return header + list(_rows(model, prefix, with_sections))


def _rows(model: type[BaseModel], prefix: str, with_sections: bool = True) -> Iterator[str]:
    for name, field in model.model_fields.items():
        path, inner = f"{prefix}{name}", _without_none(field.annotation)
        if _is_model(inner) and field.default_factory is not None:
            if with_sections:  # an always-present section: list its fields instead
                yield from _rows(inner, f"{path}.")
            continue
        type_name = _type_name(field.annotation) + _bounds(field.metadata)
        cells = (f"`{path}`", type_name, _default(field), _described(path, field.description or ""))
        yield "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
        if _is_model(inner):
            yield from _rows(inner, f"{path}.")
        elif get_origin(inner) is list and _is_model(get_args(inner)[0]):
            yield from _rows(get_args(inner)[0], f"{path}[].")


def _type_name(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is Annotated:
        return _type_name(args[0]) + _bounds(tp.__metadata__)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is dict:
        return "mapping"
    if _is_model(tp):
        return "object"
    return "any" if tp is Any else tp.__name__


_BOUND_SYMBOLS = {
    "gt": ">",
    "ge": ">=",
    "lt": "<",
    "le": "<=",
    "min_length": "length >=",
    "max_length": "length <=",
}


def _bounds(metadata: Iterable[Any]) -> str:
    """Constraints such as Gt(0) as " (> 0)"; a nested FieldInfo contributes its own."""
    items = [x for m in metadata for x in (m.metadata if isinstance(m, FieldInfo) else [m])]
    bounds = [
        f"{symbol} {getattr(item, attr)}"
        for item in items
        for attr, symbol in _BOUND_SYMBOLS.items()
        if getattr(item, attr, None) is not None
    ]
    return f" ({', '.join(bounds)})" if bounds else ""


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return f"`{json.dumps(to_jsonable_python(value), ensure_ascii=False)}`"


def _summary(doc: str | None) -> str:
    """The first paragraph of a docstring, on one line."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())
