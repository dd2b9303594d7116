"""The sections of a run spec (`model`, `data`, `rollout`, `actor`, ... `tools`): one pydantic
model each, every field typed, bounded and described."""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from rl_core.spec.limits import (
    AdvEstimator,
    DeviceType,
    JsonMapping,
    KLType,
    LossAggMode,
    MAX_BATCH,
    MAX_DEVICES,
    MAX_DEVICES_PER_NODE,
    MAX_EPOCHS,
    MAX_INT,
    MAX_KWARGS_DEPTH,
    MAX_KWARGS_NODES,
    MAX_LIST,
    MAX_MICRO_BATCH,
    MAX_NODES,
    MAX_PARALLEL,
    MAX_SAMPLES,
    MAX_STALENESS,
    MAX_STEPS,
    MAX_TOKENS,
    MAX_TOKEN_BUDGET,
    ModelLocation,
    Strict,
    plain_text_problem,
)

# --------------------------------------------------------------------------- sections


class ModelConfig(Strict):
    """The policy model: what is trained and generates."""

    path: ModelLocation = Field(
        "tiny:small",
        min_length=1,
        description="Hugging Face causal-LM folder: a dense decoder (Qwen2/2.5/3, Llama, ...) or "
        "a Qwen3-MoE kind of mixture of experts (see parallel.expert_parallel_size). Or a "
        "built-in tiny model for tests and CPU runs: `tiny:<size>` (nano, small, base, moe-nano, "
        "moe, vl), or a warm start made on first use by a short SFT (tiny:small-addition, "
        "tiny:moe-addition, tiny:vl-squares, tiny:small-calculator; docs/rl_core.md).",
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


class SyntheticData(Strict):
    """Generated arithmetic prompts with exact answers, for tests and smoke runs."""

    task: Literal["addition", "multiplication", "countdown", "squares"] = Field(
        "addition", description="Which generated task to use: arithmetic (addition, "
        "multiplication, countdown), or `squares`, counting the squares drawn in a picture (a "
        "vision-language task: records with images, for tiny:vl; `digits` unused)."
    )
    digits: int = Field(2, ge=1, le=9, description="Digits per operand.")
    num_train: int = Field(256, gt=0, le=1_000_000, description="Number of training prompts.")
    num_val: int = Field(32, ge=0, le=100_000, description="Number of validation prompts.")


class DataConfig(Strict):
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
    image_key: str | None = Field(
        None, description="Vision-language data: the record field naming each prompt's images "
        "(one or a list; each a path relative to the data file's folder or absolute, bytes, or a "
        "mapping with `bytes` or `path` as Hugging Face datasets store images in parquet). "
        "null: text only.",
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


class ToolSpec(Strict):
    """One tool offered to the model in multi-turn rollouts (`rl_core.tools`)."""

    name: str = Field(
        min_length=1, max_length=128,
        description="Registered tool name: the built-ins `calculator` and `python`, or a tool "
        "installed under the `ascent.tools` entry point group.",
    )
    kwargs: JsonMapping = Field(
        default_factory=dict,
        description="Keyword arguments of the tool's factory: JSON values, at most "
        f"{MAX_KWARGS_DEPTH} levels deep and {MAX_KWARGS_NODES} values.",
    )


class SandboxConfig(Strict):
    """The limits of each tool call that runs code (a process of its own, no network, a
    throwaway working folder)."""

    cpu_time_s: float = Field(5.0, gt=0, le=600, description="CPU seconds per call.")
    memory_mb: int = Field(512, ge=32, le=65_536, description="Address space per call, MiB.")
    wall_time_s: float = Field(10.0, gt=0, le=3_600, description="Wall-clock seconds per call.")
    output_bytes: int = Field(
        4096, ge=64, le=1_048_576,
        description="Output kept per call; a call that writes more is stopped and its answer "
        "says so.",
    )


class MultiTurnConfig(Strict):
    """Multi-turn rollouts with tools: the model's turn may call a tool, whose answer is
    appended as tokens before the model's next turn (`rl_core.rollout.turns`)."""

    max_turns: int = Field(
        4, ge=1, le=64,
        description="Assistant turns per response, the last included: a turn that calls a tool "
        "after this many ends the response without an answer to the call.",
    )
    tools: list[ToolSpec] = Field(
        min_length=1, max_length=32,
        description="The tools offered; a call to any other name is answered with an error "
        "text naming the tools.",
    )
    format: Literal["hermes"] = Field(
        "hermes",
        description="How tool calls and answers are written: `hermes` (Qwen2.5/Qwen3, "
        "Hermes): a call is `<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>` in "
        "the model's turn, the answer a user turn `<tool_response>...</tool_response>` in the "
        "ChatML format.",
    )
    max_calls_per_turn: int = Field(
        4, ge=1, le=64,
        description="Tool calls answered in one turn; more are answered with an error text.",
    )
    max_tool_response_tokens: int = Field(
        256, ge=8, le=MAX_TOKENS,
        description="Longest answer of one tool call in tokens; a longer one is cut.",
    )
    tool_concurrency: int = Field(
        8, ge=1, le=256, description="Tool calls run at once by the process that rolls out."
    )
    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig, description="Limits of each tool call that runs code."
    )


class RolloutConfig(Strict):
    """Response generation. `tensor_parallel_size` here is the inference layout."""

    engine: Literal["auto", "native", "vllm"] = Field(
        "auto",
        description="`native` generates with the training weights in the same process (no "
        "second copy of them); `vllm` with an in-process vLLM engine on each actor rank "
        "(vllm-ascend on Ascend, vLLM's CPU build on cpu), synced from the training engine "
        "after every update; `auto` is `vllm` on gpu and npu when vLLM is importable on the "
        "host that starts the run, else `native`, and always `native` on cpu (the memory plan "
        "counts vLLM's share on gpu and npu).",
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
        description="Inference tensor-parallel size: blocks of this many consecutive devices "
        "generate together, each holding its part of every layer (the native engine, with "
        "actor.strategy: fsdp2, or vLLM's own tensor parallelism over the actor's process "
        "group); independent of `parallel.tensor_parallel_size`: the weights come from "
        "training bucket by bucket and each device keeps its part.",
    )
    log_prob_micro_batch_size: int = Field(
        4,
        gt=0,
        le=MAX_MICRO_BATCH,
        description="Responses per device per forward when computing old log-probs."
    )
    multi_turn: MultiTurnConfig | None = Field(
        None,
        description="Multi-turn rollouts with tools: each response is the model's turns and the "
        "tools' answers in between, as tokens (never decoded and encoded again); the answers "
        "carry no loss, and `max_new_tokens` bounds the whole response. Null: one turn.",
    )


class OffloadConfig(Strict):
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


# the attention and MLP projections of Llama-style decoders (Llama, Mistral, Qwen2/3)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ModuleName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.]+$")]


class LoraConfig(Strict):
    """Low-rank adapters (LoRA) on the policy's linear layers: only the adapters train."""

    rank: int = Field(16, gt=0, le=4096, description="The rank r of each adapter pair "
                      "(A: r × in, B: out × r).")
    alpha: float = Field(32.0, gt=0, le=1e6, description="Scale numerator: each layer computes "
                         "W x + (alpha / rank) · B A x.")
    target_modules: list[ModuleName] | Literal["all-linear"] = Field(
        list(LORA_TARGETS), max_length=MAX_LIST,
        description="The linear layers that get adapters, by the last part of their module name "
        "(default: the attention and MLP projections q_proj, k_proj, v_proj, o_proj, "
        "gate_proj, up_proj, down_proj), or `all-linear`: every linear layer but the output "
        "head.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on each adapter's input in "
                           "the update (off in log-prob passes).")


class ActorConfig(Strict):
    """The policy update: optimizer, PPO-style clipped loss, KL loss and batching."""

    strategy: Literal["torch", "fsdp2", "megatron"] = Field(
        "torch",
        description="Training engine: `torch` is the plain PyTorch engine, one full copy of the "
        "model, gradients and optimizer state per data-parallel rank; `fsdp2` shards them over "
        "the ranks with PyTorch FSDP2 (float32 master weights, compute in `model.dtype`; the "
        "rollout keeps a full copy synced after every update; the critic is sharded the same "
        "way and the reference without optimizer state; checkpoints are sharded with "
        "torch.distributed.checkpoint); `megatron` trains with Megatron-Core (tensor, "
        "pipeline, context and expert parallelism from `parallel`, its distributed optimizer, "
        "the model converted from the Hugging Face folder by mbridge; the `megatron` extra, "
        "on gpu or npu devices).",
    )
    recompute: Literal["full", "selective"] | None = Field(
        None,
        description="With `actor.strategy: megatron`: Megatron's activation recomputation. "
        "`full` keeps each decoder layer's input and recomputes the layer in backward; "
        "`selective` recomputes the attention core only. Null follows "
        "model.gradient_checkpointing (full when it is on).",
    )
    router_aux_loss_coef: float | None = Field(
        None, ge=0, le=1,
        description="A mixture of experts: the weight of the routers' load-balancing loss "
        "(Switch Transformer's, over each micro-batch's valid tokens and all MoE layers) added "
        "to the actor's loss; null takes the model config's (0.001 for Qwen3-MoE), 0 turns it "
        "off. Refused for a dense model. With actor.strategy: megatron the routers train "
        "without it (null means off; another value is refused).",
    )
    master_weights: bool = Field(
        True,
        description="With `model.dtype: bfloat16` and `actor.strategy: torch` (the actor and the "
        "critic): AdamW steps float32 master weights with float32 moments, gradients accumulate "
        "in float32, and the model computes in a bfloat16 copy set after every step. false: pure "
        "bfloat16, AdamW updates the bfloat16 weights themselves (half the optimizer memory; an "
        "update below a weight's bfloat16 resolution, about 0.4 % of it, is lost). fsdp2 always "
        "keeps float32 masters; with float32 the weights are their own masters.",
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
    lora: LoraConfig | None = Field(
        None,
        description="Train low-rank adapters (PEFT's LoRA) instead of every weight: the base "
        "stays frozen in `model.dtype`, gradients and AdamW state are the adapters' only; the "
        "reference is the same model with its adapters off (no second copy is loaded); the "
        "rollout gets the merged weights W + (alpha / rank) · B A after every update; "
        "checkpoints hold the adapters and their optimizer state, and the saved and exported "
        "Hugging Face folders the merged model. With actor.strategy torch or fsdp2. Null: full "
        "fine-tuning.",
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


class OverlongBuffer(Strict):
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


class DynamicSampling(Strict):
    """DAPO dynamic sampling: drop prompt groups whose rewards are all equal."""

    enable: bool = Field(
        False, description="Keep generating until a step has enough informative groups."
    )
    max_num_gen_batches: int = Field(
        10, ge=0, le=1_000, description="Most generation batches per step; 0 means no limit."
    )


class AdvantageConfig(Strict):
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


class DPOConfig(Strict):
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


class ReferenceConfig(Strict):
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


class CriticConfig(Strict):
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


class RewardFunctionSpec(Strict):
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



_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class RemoteRewardConfig(Strict):
    """An HTTP reward service (`rl_core.rewards.remote`): each response is POSTed as JSON
    {"prompt", "response", "ground_truth"} and the answer {"score": number} is added to the
    summed reward with `weight`."""

    url: str = Field(
        min_length=1, max_length=2_048,
        description="The service's address, http:// or https:// (no user name or password in "
        "it: give a token with token_env).",
    )
    token_env: str | None = Field(
        None, max_length=256,
        description="Name of an environment variable of the reward workers holding a bearer "
        "token, sent as `Authorization: Bearer <token>`; read when scoring, never stored or "
        "shown. Null sends none.",
    )
    weight: float = Field(
        1.0, ge=-1_000, le=1_000, description="Weight of the service's score in the summed reward."
    )
    timeout_s: float = Field(
        30.0, gt=0, le=3_600, description="Time limit of one request (to connect, and between "
        "bytes of the answer).",
    )
    retries: int = Field(
        3, ge=0, le=20, description="Retries of a request that timed out, could not connect or "
        "was answered with a 5xx status (a 4xx status is not retried).",
    )
    backoff_s: float = Field(
        0.5, ge=0, le=600, description="Wait before the first retry, doubled for each next one "
        "(times a random factor between 0.5 and 1).",
    )
    max_concurrency: int = Field(
        8, ge=1, le=1_024, description="Requests in flight at once, per reward worker.",
    )
    on_failure: Literal["error", "zero"] = Field(
        "error", description="A response the service could not score after its retries: "
        "`error` stops the run naming the url, the attempts and the last error; `zero` scores "
        "it 0 and counts it in reward/remote/failures.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        problem = plain_text_problem(url)
        if problem or any(c.isspace() for c in url):
            raise ValueError(problem or "holds white space: give the address without it")
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - a port that is not a number raises ValueError
        except ValueError as error:
            raise ValueError(f"{url!r} is not a valid address: {error}") from None
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"{url!r}: the scheme must be http or https, not "
                             f"{parts.scheme or 'missing'}: e.g. https://rewards.example.com/score")
        if not parts.hostname:
            raise ValueError(f"{url!r} names no host: e.g. https://rewards.example.com/score")
        if parts.username is not None or parts.password is not None:
            raise ValueError("holds a user name or password, which the spec would keep: remove "
                             "it and give a token with reward.remote.token_env")
        return url

    @field_validator("token_env")
    @classmethod
    def _env_name(cls, name: str | None) -> str | None:
        if name is not None and not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name: letters, digits "
                             "and _, not starting with a digit (e.g. REWARD_TOKEN)")
        return name


class RewardConfig(Strict):
    """How responses are scored."""

    functions: list[RewardFunctionSpec] = Field(
        default_factory=lambda: [RewardFunctionSpec(name="math_accuracy")],
        max_length=64,
        description="Rule-based rewards, summed with their weights.",
    )
    timeout_s: float = Field(
        10.0, gt=0, le=3_600, description="Time limit per response for each function (for "
        "code_execution, all of a response's test cases together)."
    )
    reward_model: ModelLocation | None = Field(
        None,
        description="A learned reward model scored in addition to the functions: a Hugging "
        "Face sequence-classification folder with one label (num_labels: 1) and the policy's "
        "tokenizer, which scores each prompt and response at the response's last token. It "
        "runs as a role of its own on every device, beside the actor (frozen, whole, in "
        "model.dtype); with no functions it is the whole reward.",
    )
    reward_model_weight: float = Field(
        1.0, ge=-1_000, le=1_000,
        description="Weight of the reward model's score in the summed reward.",
    )
    reward_model_micro_batch_size: int = Field(
        4, gt=0, le=MAX_MICRO_BATCH,
        description="Responses per device per reward-model forward.",
    )
    remote: RemoteRewardConfig | None = Field(
        None,
        description="An HTTP reward service scored in addition to the functions (and the "
        "reward model), by the reward workers; its score goes into the sum and into "
        "reward/remote/mean. See docs/rl_core.md for its protocol.",
    )


class ParallelConfig(Strict):
    """Training layout. The inference layout is `rollout.tensor_parallel_size`."""

    tensor_parallel_size: int = Field(
        1,
        gt=0,
        le=MAX_PARALLEL,
        description="Training tensor-parallel size: each decoder layer's matrices, the "
        "embedding and the LM head are split over this many devices, which hold the same rows "
        "(needs actor.strategy: fsdp2, which shards over the rest, or megatron; attention heads, "
        "key/value heads and the MLP width divisible by it).",
    )
    pipeline_parallel_size: int = Field(
        1, gt=0, le=MAX_PARALLEL,
        description="Training pipeline-parallel size (actor.strategy: megatron): the decoder "
        "layers are cut into this many consecutive stages, one per device of a pipeline, and "
        "micro-batches flow through them (1F1B); the number of layers divides by it (times "
        "virtual_pipeline_parallel_size).")
    virtual_pipeline_parallel_size: int = Field(
        1, gt=0, le=MAX_PARALLEL,
        description="With pipeline_parallel_size > 1: stages per device (Megatron's "
        "interleaved schedule): each device holds this many non-adjacent chunks of layers, "
        "which shrinks the pipeline's idle time by as much; a step's micro-batches are made a "
        "multiple of pipeline_parallel_size (with empty ones that count for nothing).")
    expert_parallel_size: int = Field(
        1,
        gt=0,
        le=MAX_PARALLEL,
        description="Expert-parallel size (a mixture of experts, with actor.strategy: fsdp2 or "
        "megatron): "
        "blocks of this many devices split every layer's experts, each device holding 1/size "
        "of them; tokens go to their experts' devices and back by all-to-all. The devices keep "
        "their own rows (it divides the data-parallel devices, not the others); the number of "
        "experts must divide by it.",
    )
    context_parallel_size: int = Field(
        1,
        gt=0,
        le=MAX_PARALLEL,
        description="Context-parallel size: the packed tokens of each micro-batch are split "
        "over this many devices, which hold the same rows (needs actor.use_remove_padding; "
        "with `ulysses`, attention heads divisible by it).",
    )
    context_parallel_algo: Literal["ulysses", "ring"] = Field(
        "ulysses",
        description="Context-parallel attention: `ulysses` exchanges tokens for heads by "
        "all-to-all (two exchanges a layer, each device a share of the heads); `ring` passes "
        "key/value blocks around the group (any head count; size - 1 passes a layer).",
    )
    data_parallel_size: int | None = Field(
        None,
        gt=0,
        le=MAX_DEVICES,
        description="Null derives it: devices / (tensor × pipeline × context parallel)."
    )
    colocate_actor_rollout: bool = Field(
        True,
        description="`true`: actor and rollout share devices, switching between training and "
        "generation. `false`: the last `rollout_devices` devices of the run are a rollout pool "
        "that only generates (an engine and a copy of the policy on each), the others train; "
        "after every update the weights go from the first training device to the pool over a "
        "process group of their own, bucket by bucket.",
    )
    rollout_devices: int = Field(
        0, ge=0, le=MAX_PARALLEL,
        description="With colocate_actor_rollout: false, the devices of the rollout pool (the "
        "run's last ones); 0 when colocated.",
    )
    resharding: Literal["auto", "none"] = Field(
        "auto",
        description="`auto`: after each update every weight goes to the rollout in full, "
        "bucket by bucket, and each rollout device keeps its part (any training layout); "
        "`none`: the layouts must be identical (rollout.tensor_parallel_size = "
        "tensor_parallel_size), and the layers' projections go as each device's "
        "tensor-parallel part, gathered over the FSDP2 shards only (the native engine: "
        "vLLM's loaders take whole tensors and cut their part themselves).",
    )


class ResourcesConfig(Strict):
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


class TrainerConfig(Strict):
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
    max_staleness: int = Field(
        0, ge=0, le=MAX_STALENESS,
        description="How many policy versions a rollout may lag the update it trains: 0 is "
        "on-policy (generate, then train); k > 0 lets a rollout pool of its own "
        "(`parallel.colocate_actor_rollout: false`) generate the next k batches while the "
        "actor trains, each from the weights it last received (at most k updates old, counted "
        "in `async/staleness`). The update recomputes the old log-probs and corrects for the "
        "rollout's policy by `actor.rollout_is`; batches generated ahead are kept in "
        "checkpoints.",
    )
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


class ProfilingConfig(Strict):
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


class PrecisionConfig(Strict):
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


class MonitorConfig(Strict):
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


class ToolsConfig(Strict):
    """Profiling, precision dumps and monitoring."""

    profiling: ProfilingConfig = Field(
        default_factory=ProfilingConfig, description="Profiler traces."
    )
    precision: PrecisionConfig = Field(
        default_factory=PrecisionConfig, description="Precision dumps."
    )
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="Device monitoring.")
