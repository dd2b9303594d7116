"""What a valid spec must also satisfy: values not implemented yet (`NOT_IMPLEMENTED`, refused
at their field before anything else) and the cross-field rules (`RULES`); each yields (field
path, message) and its docstring is listed in the generated reference. `planned_engine` is the
rollout engine the rules and the memory plan take `rollout.engine: auto` for."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from rl_core.spec.limits import GROUP_ESTIMATORS, Violation
from rl_core.spec.sections import ActorConfig, RewardConfig, RolloutConfig

if TYPE_CHECKING:  # RunSpec checks itself with these rules
    from rl_core.spec.model import RunSpec

# --------------------------------------------------------------------------- not implemented yet
# Fields that the schema describes but no code builds beyond the values listed: dotted path ->
# the only values accepted today. A spec that sets another value is refused at that field before
# the cross-field rules run; the reference and the JSON Schema mark each of these fields. An
# entry goes when its feature lands.
NOT_IMPLEMENTED: dict[str, tuple[Any, ...]] = {}


def not_implemented_note(path: str) -> str | None:
    """The note `not implemented yet (only X)` of a field in NOT_IMPLEMENTED; None for others."""
    allowed = NOT_IMPLEMENTED.get(path)
    if allowed is None:
        return None
    return f"not implemented yet (only {' or '.join(_shown(value) for value in allowed)})"


def _shown(value: Any) -> str:
    """A value as it is written in YAML: text bare, anything else as JSON (true, null, [2])."""
    return value if isinstance(value, str) else json.dumps(to_jsonable_python(value))


def refusals(spec: BaseModel) -> list[Violation]:
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
    world, mp = s.training_devices, s.model_parallel_size
    if world < 1:
        return  # _rule_rollout_pool names it
    if world % mp:
        pool = " less parallel.rollout_devices" if s.parallel.rollout_devices else ""
        yield (
            "parallel",
            f"{world} devices (resources.num_nodes × resources.devices_per_node{pool}) do not "
            f"split into groups of tensor × pipeline × context parallel = {mp}: change the "
            "parallel sizes or the device count",
        )
        return
    dp = world // mp
    if s.parallel.data_parallel_size not in (None, dp):
        yield (
            "parallel.data_parallel_size",
            f"data_parallel_size ({s.parallel.data_parallel_size}) must equal devices / "
            f"(tensor × pipeline × context parallel) = {dp}: set it to {dp} or null",
        )
    rollout = s.parallel.rollout_devices or world
    if rollout % s.rollout.tensor_parallel_size:
        yield (
            "rollout.tensor_parallel_size",
            f"{rollout} devices do not split into inference groups of "
            f"{s.rollout.tensor_parallel_size}: use a divisor of {rollout}",
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


def _rule_rollout_pool(s: RunSpec) -> Iterator[Violation]:
    """A rollout pool of its own (`parallel.colocate_actor_rollout: false`) takes
    `parallel.rollout_devices` of the run's devices and leaves at least one to train; its
    ranks generate one by one (rollout groups over the pool are not built yet)."""
    p, world = s.parallel, s.world_size
    if p.colocate_actor_rollout:
        if p.rollout_devices:
            yield ("parallel.rollout_devices", "is the rollout pool's device count, which needs "
                   "parallel.colocate_actor_rollout: false: set it, or remove rollout_devices")
        return
    if not 0 < p.rollout_devices < world:
        yield ("parallel.rollout_devices", f"{p.rollout_devices}: a rollout pool of its own "
               f"takes 1 to {world - 1} of the run's {world} devices and leaves the rest to "
               "train: set it in that range, or parallel.colocate_actor_rollout: true")
    if s.rollout.tensor_parallel_size > 1:
        yield ("rollout.tensor_parallel_size", f"{s.rollout.tensor_parallel_size}: a rollout "
               "pool of its own generates one device per engine for now: set it to 1, or "
               "parallel.colocate_actor_rollout: true")
    if s.algorithm == "dpo":
        yield ("parallel.colocate_actor_rollout", "false is for grpo, dapo and ppo (DPO's "
               "steps sync the rollout after every mini-batch): set it to true")


def _rule_staleness(s: RunSpec) -> Iterator[Violation]:
    """Rollouts ahead of the update (`trainer.max_staleness` > 0) are generated by a rollout
    pool of its own while the actor trains; not with DAPO's dynamic sampling or partial
    rollout, whose steps take as many rollouts as they need."""
    k = s.trainer.max_staleness
    if not k:
        return
    if s.parallel.colocate_actor_rollout:
        yield ("trainer.max_staleness", f"{k}: rollouts ahead of the update are generated by a "
               "rollout pool of its own while the actor trains: set "
               "parallel.colocate_actor_rollout: false with parallel.rollout_devices, or "
               "trainer.max_staleness: 0")
    if s.advantage.dynamic_sampling.enable:
        yield ("trainer.max_staleness", f"{k} with advantage.dynamic_sampling: a step's "
               "generation rounds depend on its rewards, so they cannot be generated ahead: "
               "disable one of them")
    if s.rollout.partial_rollout_max_split:
        yield ("trainer.max_staleness", f"{k} with rollout.partial_rollout_max_split: partial "
               "rollout already carries responses across policy versions; disable one of them")


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


def _rule_multi_turn(s: RunSpec) -> Iterator[Violation]:
    """Multi-turn rollouts for grpo, dapo and ppo, with one generation batch per step: not with
    DAPO's dynamic sampling or rollouts ahead of the update (`trainer.max_staleness`)."""
    if s.rollout.multi_turn is None:
        return
    field = "rollout.multi_turn"
    if s.algorithm == "dpo":
        yield (field, "DPO makes its pairs from single responses: remove rollout.multi_turn "
               "(multi-turn rollouts are for grpo, dapo and ppo)")
    if s.advantage.dynamic_sampling.enable:
        yield (field, "not with dynamic sampling yet: set advantage.dynamic_sampling.enable="
               "false or remove rollout.multi_turn")
    if s.trainer.max_staleness:
        yield (field, "not with rollouts ahead of the update yet: set trainer.max_staleness=0 "
               "or remove rollout.multi_turn")
    names = [tool.name for tool in s.rollout.multi_turn.tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            yield (f"{field}.tools.{i}.name", f"{name!r} is listed twice: list each tool once")


def _rule_reward(s: RunSpec) -> Iterator[Violation]:
    """GRPO, DAPO and PPO need a reward: `reward.functions`, `reward.remote` or
    `reward.reward_model`. A reward model is a folder (a tiny preset is a causal LM), and its
    settings go with it; alone, it leaves validation (which scores with the functions and the
    remote service) nothing to score; DPO from preference files scores nothing, so it takes
    none."""
    r, defaults = s.reward, RewardConfig()
    if (s.algorithm != "dpo" and not r.functions and r.remote is None
            and r.reward_model is None):
        yield ("reward.functions", f"{s.algorithm} needs a reward: add reward.functions, "
               "reward.remote or reward.reward_model")
    if r.reward_model is not None and r.reward_model.startswith("tiny:"):
        yield ("reward.reward_model", f"{r.reward_model} is a tiny causal LM, not a reward model: "
               "give a sequence-classification folder (a tiny one: "
               "rl_core.models.tiny.save_tiny_reward_model)")
    if r.reward_model is None:
        for name in ("reward_model_weight", "reward_model_micro_batch_size"):
            if getattr(r, name) != getattr(defaults, name):
                yield (f"reward.{name}",
                       "is a reward-model setting: set reward.reward_model or remove it")
    elif not r.functions and s.trainer.eval_every:
        yield ("trainer.eval_every", "validation scores greedy answers with reward.functions, "
               "and the reward model is the only reward: add a function (exact_match, "
               "math_accuracy) or set trainer.eval_every: 0")
    elif s.algorithm == "dpo" and s.data.chosen_key and s.data.rejected_key:
        yield ("reward.reward_model", "DPO from preference pairs (data.chosen_key, "
               "data.rejected_key) scores nothing: remove it, or drop the keys to make pairs "
               "from the policy's scored responses")


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


def _rule_master_weights(s: RunSpec) -> Iterator[Violation]:
    """Pure bfloat16 (no float32 masters) is the plain engine's choice; fsdp2 and megatron
    have masters."""
    strategy = s.actor.strategy
    if not s.actor.master_weights and strategy != "torch":
        yield ("actor.master_weights", f"{strategy} always keeps float32 master weights "
               "(computing in model.dtype): set it to true, or use actor.strategy=torch for "
               "pure bfloat16")


def _rule_lora(s: RunSpec) -> Iterator[Violation]:
    """`actor.lora` wraps the policy with PEFT's adapters in the torch and fsdp2 engines: not
    with megatron's own layers, nor with tensor or expert parallelism (their split matrices
    have no adapters); its reference is the actor's base, so there is no reference model to
    offload."""
    if s.actor.lora is None:
        return
    if s.actor.strategy == "megatron":
        yield ("actor.lora", "adapters are trained by the torch and fsdp2 engines, not with "
               "actor.strategy: megatron: set actor.strategy: fsdp2 (or torch), or remove "
               "actor.lora")
    if s.reference.offload:
        yield ("reference.offload", "with actor.lora the reference is the actor's own base (its "
               "adapters off): there is no reference model to offload; set it to false")
    p = s.parallel
    for field, size in (("parallel.tensor_parallel_size", p.tensor_parallel_size),
                        ("parallel.expert_parallel_size", p.expert_parallel_size)):
        if size > 1:
            yield (field, f"{size} splits the matrices that actor.lora puts adapters on: set "
                   f"{field.rsplit('.', 1)[1]}: 1, or remove actor.lora")


# What the Megatron engine trains: the RL recipe's roles (not DPO's pairs, not images)
MEGATRON_ALGORITHMS = ("grpo", "dapo", "ppo")


def _rule_megatron(s: RunSpec) -> Iterator[Violation]:
    """`actor.strategy: megatron` trains on gpu or npu devices (Megatron-Core's layers need an
    accelerator) the RL algorithms' text models, without context parallelism, a balancing
    loss or `parallel.resharding: none`; pipeline parallelism and `actor.recompute` are its
    own; virtual stages need a pipeline. Whether the `megatron` extra is installed is checked
    where the run starts."""
    p, strategy = s.parallel, s.actor.strategy
    if strategy != "megatron":
        if p.pipeline_parallel_size > 1:
            yield ("parallel.pipeline_parallel_size",
                   f"{p.pipeline_parallel_size} cuts the layers into pipeline stages, which the "
                   "megatron engine trains: set actor.strategy: megatron, or "
                   "pipeline_parallel_size: 1")
        if s.actor.recompute is not None:
            yield ("actor.recompute", "is Megatron's activation recomputation: set "
                   "actor.strategy: megatron, or use model.gradient_checkpointing")
    else:
        if s.resources.device_type == "cpu":
            yield ("actor.strategy", "megatron needs gpu or npu devices (Megatron-Core's layers "
                   "run on an accelerator only): set resources.device_type, or use "
                   "actor.strategy: fsdp2 on cpu")
        if s.algorithm not in MEGATRON_ALGORITHMS:
            yield ("actor.strategy", f"megatron trains {', '.join(MEGATRON_ALGORITHMS)}; "
                   f"{s.algorithm} trains with fsdp2 or torch")
        if p.context_parallel_size > 1:
            yield ("parallel.context_parallel_size",
                   f"{p.context_parallel_size}: the megatron engine does not split sequences "
                   "yet: set it to 1, or use actor.strategy: fsdp2 for context parallelism")
        if p.resharding == "none":
            yield ("parallel.resharding", "none sends the training layout's parts as they "
                   "are, which the megatron engine does not: set it to auto (each weight "
                   "goes whole, one at a time)")
        if s.actor.router_aux_loss_coef:
            yield ("actor.router_aux_loss_coef",
                   f"{s.actor.router_aux_loss_coef}: the megatron engine trains the routers "
                   "without a balancing loss (as RL runs do): leave it unset or 0")
    if p.virtual_pipeline_parallel_size > 1 and p.pipeline_parallel_size == 1:
        yield ("parallel.virtual_pipeline_parallel_size",
               f"{p.virtual_pipeline_parallel_size} stages per device interleave a pipeline: set "
               "parallel.pipeline_parallel_size above 1, or virtual_pipeline_parallel_size: 1")


def planned_engine(spec: RunSpec) -> str:
    """The rollout engine a run of `spec` is planned with before the host that starts it is
    known, "native" or "vllm": `auto` is vLLM on gpu and npu (where the run takes it if vLLM is
    importable there) and the native engine on cpu; `native` and `vllm` are themselves."""
    engine = spec.rollout.engine
    if engine != "auto":
        return engine
    return "native" if spec.resources.device_type == "cpu" else "vllm"


def _rule_context_parallel(s: RunSpec) -> Iterator[Violation]:
    """Context parallelism splits the tokens of packed micro-batches: it needs
    `actor.use_remove_padding`."""
    size = s.parallel.context_parallel_size
    if size > 1 and not s.actor.use_remove_padding:
        yield ("parallel.context_parallel_size",
               f"{size} splits each packed micro-batch's tokens over {size} devices: set "
               "actor.use_remove_padding: true, or context_parallel_size: 1")


def _rule_tensor_parallel(s: RunSpec) -> Iterator[Violation]:
    """Tensor parallelism splits the model's matrices (as DTensors under FSDP2, or Megatron's
    own layers): it needs `actor.strategy: fsdp2` or `megatron`."""
    size = s.parallel.tensor_parallel_size
    if size > 1 and s.actor.strategy == "torch":
        yield ("parallel.tensor_parallel_size",
               f"{size} splits the model's matrices over {size} devices, which the fsdp2 and "
               f"megatron engines train: set actor.strategy: fsdp2, or tensor_parallel_size: 1")


def _rule_expert_parallel(s: RunSpec) -> Iterator[Violation]:
    """Expert parallelism splits the experts as DTensors under FSDP2 (`actor.strategy:
    fsdp2`), over blocks of data-parallel devices (the data-parallel size divides by it), not
    beside tensor or context parallelism; or Megatron's experts (`megatron`), over blocks of
    the data- and context-parallel devices, beside any other layout. Whether the model has
    experts, and how many, is checked when it loads."""
    p = s.parallel
    size = p.expert_parallel_size
    if size == 1:
        return
    if s.actor.strategy == "torch":
        yield ("parallel.expert_parallel_size",
               f"{size} splits the experts over {size} devices as FSDP2 shards: set "
               "actor.strategy: fsdp2, or expert_parallel_size: 1")
    if s.actor.strategy == "megatron":  # Megatron's expert blocks: of the dp × cp devices
        span = s.data_parallel_size * p.context_parallel_size
        if span >= 1 and span % size:
            yield ("parallel.expert_parallel_size",
                   f"{size} does not divide the {span} data- and context-parallel devices "
                   f"(data_parallel_size × context_parallel_size) whose blocks split the "
                   f"experts: use a divisor of {span}")
        return
    for other in ("tensor_parallel_size", "context_parallel_size", "pipeline_parallel_size"):
        if getattr(p, other) > 1:
            yield ("parallel.expert_parallel_size",
                   f"{size} together with parallel.{other} {getattr(p, other)} is not "
                   f"supported: set one of them to 1")
            return
    world = s.training_devices
    if world >= 1 and world % size:
        yield ("parallel.expert_parallel_size",
               f"{size} does not divide the {world} training devices, whose blocks of {size} "
               f"split the experts: use a divisor of {world}")


# The vision-language model types rl_core trains (rl_core.models.loading.TRAINED_VISION_TYPES).
VISION_MODEL_TYPES = ("qwen2_5_vl",)


def has_images(s: RunSpec) -> bool:
    """Whether the spec's prompts come with images (a vision-language run)."""
    synthetic = s.data.synthetic
    return s.data.image_key is not None or (synthetic is not None and synthetic.task == "squares")


def _rule_images(s: RunSpec) -> Iterator[Violation]:
    """Prompts with images (`data.image_key`, or the synthetic `squares` task) train a
    vision-language model (padded or packed) without tensor, context or expert parallelism,
    generate with the native engine alone (no vLLM, no rollout group, no partial rollout), and
    are RL prompts: not DPO's pairs, no critic or reward model (text models) reading them."""
    d = s.data
    if d.image_key is not None and d.synthetic is not None:
        yield ("data.image_key", "the synthetic task names its own images: remove "
               "data.image_key, or use data.train_files")
    if not has_images(s):
        return
    what = "prompts with images"
    refused = [
        ("parallel.tensor_parallel_size", s.parallel.tensor_parallel_size > 1, "set it to 1"),
        ("parallel.context_parallel_size", s.parallel.context_parallel_size > 1, "set it to 1"),
        ("parallel.expert_parallel_size", s.parallel.expert_parallel_size > 1, "set it to 1"),
        ("actor.strategy", s.actor.strategy == "megatron", "use fsdp2 or torch"),
        ("rollout.engine", planned_engine(s) == "vllm",
         "vLLM is not given the images yet: set rollout.engine: native"),
        ("rollout.tensor_parallel_size", s.rollout.tensor_parallel_size > 1, "set it to 1"),
        ("rollout.partial_rollout_max_split", s.rollout.partial_rollout_max_split > 1,
         "partial rollout resumes text contexts: set it to 1"),
        ("algorithm", s.algorithm == "dpo", "DPO's preference pairs are text: use grpo, dapo "
         "or ppo"),
        ("critic.enable", s.critic.enable, "the critic is a text model: use an algorithm "
         "without one (grpo, dapo)"),
        ("reward.reward_model", s.reward.reward_model is not None,
         "a reward model reads text only: score with rule rewards"),
    ]
    for field, broken, fix in refused:
        if broken:
            yield field, f"not supported with {what}: {fix}"


def model_violations(s: RunSpec, experts: int, model_type: str = "",
                     layout: Any = None) -> list[Violation]:
    """What a spec asks of its model that the model cannot give, once its number of routed
    experts and its type are known (from its config.json or a tiny preset): images need a
    vision-language model; expert parallelism and
    the balancing loss need experts (as many as the expert-parallel size divides); a mixture of
    experts trains without tensor and context parallelism (but with megatron), and generates
    whole on each device (no native rollout group, whose fast decoder splits dense layers
    only; no vLLM tensor-parallel group, whose sync is verified for dense models only).
    `layout`: the model's config (config.json's names: num_hidden_layers,
    num_attention_heads, num_key_value_heads), for the megatron engine's split of layers over
    pipeline stages and of heads over tensor-parallel devices."""
    p, out = s.parallel, []
    what = f" ({model_type})" if model_type else ""
    if s.actor.strategy == "megatron" and layout is not None:
        out += megatron_violations(s, layout, what)
    if has_images(s) and model_type not in VISION_MODEL_TYPES:
        out.append(("model.path", f"the prompts have images and the model{what} reads text "
                    f"only: point it at a vision-language model ({', '.join(VISION_MODEL_TYPES)}"
                    "; tiny:vl)"))
    if p.expert_parallel_size > 1 and not experts:
        out.append(("parallel.expert_parallel_size",
                    f"{p.expert_parallel_size}, but the model{what} is dense: expert "
                    "parallelism splits a mixture of experts' experts; set it to 1"))
    elif experts and experts % p.expert_parallel_size:
        out.append(("parallel.expert_parallel_size",
                    f"{p.expert_parallel_size} does not divide the model's {experts} experts "
                    f"(each device holds an equal share of them): pick a divisor of {experts}"))
    if s.actor.router_aux_loss_coef and not experts:
        out.append(("actor.router_aux_loss_coef",
                    f"{s.actor.router_aux_loss_coef}, but the model{what} is dense, with no "
                    "routers to balance: leave it unset"))
    if not experts:
        return out
    moe = f"a mixture of experts{what}"
    for field, size in (("parallel.tensor_parallel_size", p.tensor_parallel_size),
                        ("parallel.context_parallel_size", p.context_parallel_size)):
        if size > 1 and s.actor.strategy != "megatron":
            out.append((field, f"{size} is not supported for {moe}: set it to 1 and split "
                        "the experts with parallel.expert_parallel_size"))
    if s.rollout.tensor_parallel_size > 1:
        how = ("the sync into a vLLM tensor-parallel group is verified for dense models only"
               if planned_engine(s) == "vllm" else
               "the native engine's rollout groups split dense layers only")
        out.append(("rollout.tensor_parallel_size",
                    f"{s.rollout.tensor_parallel_size}: {how}, and {moe} generates whole on "
                    "each device: set it to 1"))
    return out


def megatron_violations(s: RunSpec, config: Any, what: str = "") -> list[Violation]:
    """The megatron engine's layout against the model (`config`: config.json's names): the
    layers divide into pipeline_parallel_size × virtual_pipeline_parallel_size stages of
    equal length, the attention and key/value heads over the tensor-parallel devices; tied
    embeddings stay on one stage."""
    p, out = s.parallel, []
    layers = getattr(config, "num_hidden_layers", 0) or 0
    stages = p.pipeline_parallel_size * p.virtual_pipeline_parallel_size
    if layers and layers % stages:
        field = ("parallel.virtual_pipeline_parallel_size"
                 if p.virtual_pipeline_parallel_size > 1 else "parallel.pipeline_parallel_size")
        out.append((field, f"the model{what}'s {layers} decoder layers do not divide into "
                    f"{stages} pipeline stages (pipeline_parallel_size × "
                    f"virtual_pipeline_parallel_size): pick sizes whose product divides {layers}"))
    if p.pipeline_parallel_size > 1 and getattr(config, "tie_word_embeddings", False):
        out.append(("parallel.pipeline_parallel_size",
                    f"{p.pipeline_parallel_size}: the model{what} ties its input and output "
                    "embeddings, which Megatron keeps on the first and the last stage, and its "
                    "distributed optimizer's checkpoint of the pair does not resume exactly: "
                    "set it to 1 (tied models are small), or use actor.strategy: fsdp2"))
    size = p.tensor_parallel_size
    for name, what_heads in (("num_attention_heads", "attention heads"),
                             ("num_key_value_heads", "key/value heads")):
        count = getattr(config, name, 0) or 0
        if size > 1 and count and count % size:
            out.append(("parallel.tensor_parallel_size",
                        f"{size} does not divide the model{what}'s {count} {what_heads} (each "
                        f"device computes an equal share of them): pick a divisor of {count}"))
    return out


def _rule_rollout_parallel(s: RunSpec) -> Iterator[Violation]:
    """A rollout group of the native engine splits the rollout's own copy of the layers: it
    needs `actor.strategy: fsdp2` (the plain engine's rollout reads the training model itself);
    so does `auto`, which may take the native engine on the host that starts the run. vLLM
    splits its own copy, from any training engine, and cuts its parts from whole tensors, so
    `parallel.resharding: none` (parts sent as they are trained) is the native engine's."""
    size = s.rollout.tensor_parallel_size
    if size > 1 and s.actor.strategy != "fsdp2" and s.rollout.engine != "vllm":
        yield ("rollout.tensor_parallel_size",
               f"{size} splits the rollout's own copy of the layers, which the native engine has "
               "with actor.strategy: fsdp2 (the plain engine generates from the training model "
               "itself): set actor.strategy: fsdp2, rollout.engine: vllm, or "
               "tensor_parallel_size: 1")
    if s.parallel.resharding == "none" and planned_engine(s) == "vllm":
        yield ("parallel.resharding",
               "none sends each device its tensor-parallel part as trained, which only the "
               "native engine takes (vLLM's loaders cut their part from whole tensors): set "
               "parallel.resharding: auto, or rollout.engine: native")


def _rule_rollout_engine(s: RunSpec) -> Iterator[Violation]:
    """vLLM's settings only with `rollout.engine: vllm`, or `auto` on gpu and npu (on cpu it is
    the native engine); its memory share only on accelerators; its length fits a prompt and a
    response; the IS cap only with IS on."""
    r = s.rollout
    defaults = RolloutConfig()
    if planned_engine(s) != "vllm":
        why = " and rollout.engine=auto is the native engine on cpu" if r.engine == "auto" else ""
        for name in ("gpu_memory_utilization", "max_model_len"):
            if getattr(r, name) != getattr(defaults, name):
                yield (f"rollout.{name}",
                       f"is a vLLM setting{why}: set rollout.engine=vllm or remove it")
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
        trains = s.training_devices
        beyond = sorted(rank for rank in tool.ranks if rank >= trains)
        if beyond:
            yield (f"tools.{name}.ranks", f"ranks {beyond} do not exist: the run trains on "
                   f"{trains} device(s), ranks 0..{trains - 1}")
    precision = s.tools.precision
    if precision.enable:
        for field, path in (("trainer.output_dir", s.trainer.output_dir),
                            ("tools.precision.output", precision.output)):
            if not _MSPROBE_PATH.match(path):
                yield (field, f"{path!r}: msprobe writes precision dumps only to paths of "
                       "letters, digits and _ . : / - (no spaces): choose another folder")


RULES: tuple[Callable[[RunSpec], Iterator[Violation]], ...] = (
    _rule_clip_ratios,
    _rule_data_source,
    _rule_algorithm,
    _rule_reference,
    _rule_groups,
    _rule_batch_sizes,
    _rule_rollout_pool,
    _rule_staleness,
    _rule_layouts,
    _rule_lengths,
    _rule_partial_rollout,
    _rule_multi_turn,
    _rule_reward,
    _rule_trainer,
    _rule_offload,
    _rule_master_weights,
    _rule_lora,
    _rule_megatron,
    _rule_context_parallel,
    _rule_tensor_parallel,
    _rule_expert_parallel,
    _rule_images,
    _rule_rollout_parallel,
    _rule_rollout_engine,
    _rule_tools,
)
