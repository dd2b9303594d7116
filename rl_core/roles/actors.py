"""The roles: each owns its device state and exposes a few coarse methods to the controller.

- `ActorWorker`: the policy's training engine and the rollout engine in the same process, so
  training and inference are colocated by construction: the native engine over the same
  weights, or vLLM over a copy synced after every update (and checked by version before every
  rollout); the rollout sleeps (frees its cache) before every update. Ranks > 1 train
  data-parallel.
- `RolloutWorker`: a rank of a rollout pool of its own (`parallel.colocate_actor_rollout:
  false`): a policy copy and its engine, synced over a link from the actor's rank 0.
- `ReferenceWorker`: the frozen initial policy; log-probs of the responses. With
  `reference.offload` its weights wait in host memory between uses. With `actor.lora` there is
  none: the actor's own base, its adapters off, is the reference (`ActorWorker.ref_logprobs`).
- `CriticWorker`: the value model of PPO (the policy's weights under a one-output head).
- `RewardWorker`: rule rewards scored in the worker's process pool (CPU only).
- `RewardModelWorker`: a learned reward model's scores (`reward.reward_model`), on the devices.

Stages that work row by row (`reward`, `rm_score`, `ref_logprob`, `old_logprob`, `values`) are
pulled from
the data channel by `Worker.drain`; the update takes its shard from the controller, so
data-parallel ranks always see the same rows for the same seed.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from rl_core import algos
from rl_core.checkpoint import SHARDED_DIRS, rng_state, set_rng_state
from rl_core.data.batch import Batch, images_of
from rl_core.data.prompts import decode_rows
from rl_core.determinism import seed_everything
from rl_core.engines import training_engine
from rl_core.engines.context import check_heads
from rl_core.engines.experts import num_experts
from rl_core.engines.lora import ADAPTER_DIR, save_adapters
from rl_core.engines.tensor import check_tensor_parallel
from rl_core.engines.train import PARAM_DTYPES, TrainEngine, ValueHead, batch_options
from rl_core.errors import InputError, NonFiniteError, TrainingStopped
from rl_core.models.loading import copy_processor_files, load_model_and_tokenizer
from rl_core.roles.group import Worker
from rl_core.rollout import rollout_engine, with_resolved_engine
from rl_core.rollout.parts import is_split, split_layers
from rl_core.rollout.sampling import SamplingParams, draw_uniforms
from rl_core.spec import RunSpec, model_violations

log = logging.getLogger("rl_core")


def role_device(spec: RunSpec, device: str | None) -> torch.device:
    """The device this rank computes on: `device`, or the spec's kind at local index 0 (Ray
    makes a rank's assigned accelerator the only visible one)."""
    if device is not None:
        return torch.device(device)
    from rl_core import device as devices

    return devices.torch_device(devices.get_kind(spec.resources.device_type), 0)


def role_backend(spec: RunSpec) -> str:
    """The collective backend of the spec's device kind (gloo, nccl, hccl)."""
    from rl_core import device as devices

    return devices.get_kind(spec.resources.device_type).backend


def role_mesh(role: Any):
    """The device mesh of a role's sharded engine: its ranks, split by tensor or expert
    parallelism."""
    from rl_core import device as devices

    return devices.device_mesh(role.device, role.world_size, role.tensor_parallel,
                               role.expert_parallel)


def join_layout(role: Any, spec: RunSpec, config: Any) -> None:
    """Set a role's context-, tensor- and expert-parallel sizes from `spec`, refusing (naming
    the field) a model (its `config`) whose heads, widths, layers or experts the groups
    cannot share."""
    p = spec.parallel
    role.context_parallel, role.tensor_parallel = p.context_parallel_size, p.tensor_parallel_size
    role.expert_parallel = p.expert_parallel_size
    for field, message in model_violations(spec, num_experts(config),
                                           getattr(config, "model_type", ""), layout=config):
        raise InputError(f"{field}: {message}")
    check_tensor_parallel(config, role.tensor_parallel)
    check_heads(config, role.context_parallel, p.context_parallel_algo,
                tensor=role.tensor_parallel)


def megatron_folder(spec: RunSpec, path: str | None = None) -> str:
    """The Hugging Face folder a Megatron engine converts (`model.path` or `path`, a preset
    resolved), once the `megatron` extra is known to be installed."""
    from rl_core.engines.mcore import require_megatron
    from rl_core.models.loading import resolve_model_path

    require_megatron()
    return str(resolve_model_path(path or spec.model.path))


def host_copy(state: Any) -> Any:
    """A copy of a (nested) state dict with every tensor in host memory: a checkpoint's copy of
    the optimizer state never doubles it on the device."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, Mapping):
        return {key: host_copy(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(host_copy(value) for value in state)
    return copy.deepcopy(state)


def context_options(role: Any) -> dict[str, Any]:
    """An engine's groups of a role in context- or tensor-parallel blocks (none when it is
    not): the data-parallel group, and the context-parallel one with the spec's algorithm."""
    if role.context_parallel * role.tensor_parallel == 1:
        return {}
    cp = {"cp_group": role.cp_group, "cp_algorithm": role.spec.parallel.context_parallel_algo}
    return {"dp_group": role.dp_group, **(cp if role.cp_group is not None else {})}


def temperature_of(params: SamplingParams) -> float:
    return params.temperature if params.do_sample else 1.0


def load_policy(spec: RunSpec, path: str, device: torch.device):
    return load_model_and_tokenizer(
        path, dtype=spec.model.dtype, tokenizer_path=spec.model.tokenizer_path,
        trust_remote_code=spec.model.trust_remote_code, device=device,
        gradient_checkpointing=spec.model.gradient_checkpointing)


@torch.no_grad()
def sequence_logprobs(model, columns: Mapping[str, torch.Tensor], temperature: float,
                      micro_batch_size: int | None = None, *, max_token_len: int | None = None,
                      remove_padding: bool = False) -> torch.Tensor:
    """Log-probs (B, R) of each row's response tokens under a frozen model, on the device it
    is on, micro-batched by rows or a token budget, packed with `remove_padding`."""
    param = next(model.parameters())
    dtype = next(name for name, dt in PARAM_DTYPES.items() if dt == param.dtype)
    engine = TrainEngine(model, lr=0.0, device=param.device, param_dtype=dtype,
                         micro_batch_size=micro_batch_size, max_token_len=max_token_len,
                         remove_padding=remove_padding)
    logprobs, _ = engine.forward_logprobs(
        columns["input_ids"], columns["attention_mask"], columns["position_ids"],
        columns["response_mask"].shape[1], temperature=temperature,
        images=images_of(columns))
    return logprobs.cpu()


class TrainedRole(Worker):
    """A role with a training engine: the plain one at once, or (`actor.strategy: fsdp2`,
    `megatron`) a sharded one built once the role's process group exists (a one-rank group
    when alone)."""

    def start_engine(self, spec: RunSpec, config: Any = None) -> None:
        self.sharded = spec.actor.strategy != "torch"
        join_layout(self, spec, config if config is not None else self.model.config)
        self.engine = None
        if not self.sharded:
            self.engine = self.plain_engine()
        elif self.world_size == 1:
            self.init_alone(role_backend(spec))

    def on_distributed(self) -> None:
        if self.spec.actor.strategy == "megatron":  # Megatron's groups over the role's ranks
            self.engine = self.megatron_engine()
        elif self.sharded:
            self.engine = self.sharded_engine(role_mesh(self))
        else:
            self.engine.dp_group, self.engine.cp_group = self.dp_group, self.cp_group
            self.engine.cp_algorithm = self.spec.parallel.context_parallel_algo

    @property
    def groups(self) -> dict[str, Any]:
        """A sharded engine's data- and context-parallel groups where they are not the mesh's
        (and the context-parallel algorithm)."""
        return context_options(self)

    def plain_engine(self) -> Any:
        raise NotImplementedError

    def sharded_engine(self, mesh: Any) -> Any:
        raise NotImplementedError

    def megatron_engine(self) -> Any:
        raise NotImplementedError


# --------------------------------------------------------------------------- actor + rollout


class ActorWorker(TrainedRole):
    """The policy: training engine and rollout engine over one set of weights."""

    role = "actor"

    def __init__(self, spec: RunSpec, *, model_path: str, total_steps: int,
                 sampling: SamplingParams, rank: int = 0, world_size: int = 1,
                 device: str | None = None, model=None, tokenizer=None):
        super().__init__(rank, world_size)
        # the controller hands a concrete rollout.engine; one built directly resolves auto here
        self.spec = spec = with_resolved_engine(spec)
        self.device = role_device(spec, device)
        seed_everything(spec.seed, spec.trainer.deterministic)
        # rollout groups: blocks of this many ranks generate together, each its part of the
        # layers: the native engine's split here (`rl_core.rollout.parts`), vLLM's its own copy
        self.rollout_parallel = size = spec.rollout.tensor_parallel_size
        self.rollout_split = size > 1 and spec.rollout.engine == "native"
        # a rollout pool of its own generates; rank 0 sends it the weights over `self.link`
        self.pooled = not spec.parallel.colocate_actor_rollout
        # LoRA: the training engine wraps its own copy of the base with adapters (a resumed
        # run's too: the checkpoint holds the adapters); the rollout takes merged weights
        self.lora = spec.actor.lora is not None
        self.base_path = spec.model.path if self.lora else model_path
        self.link = None
        self.sending: WeightSender | None = None  # weights on their way to the pool
        if model is None:
            # sharded with an inference engine, the full model is only the template of the
            # shards and of the saved folder: it waits in host memory (split for a rollout
            # group, it reaches the device as this rank's part only)
            home = self.device
            if spec.actor.strategy != "torch" and (spec.rollout.engine != "native" or size > 1
                                                   or not spec.parallel.colocate_actor_rollout):
                home = torch.device("cpu")
            model, tokenizer = load_policy(spec, self.base_path, home)
        if self.rollout_split:
            model = split_layers(model, rank % size, size).to(self.device)
        self.model, self.tokenizer = model, tokenizer
        self.model_path, self.total_steps = model_path, total_steps
        self.sampling = sampling
        # the number of updates the policy has taken: every rollout must come from its weights
        self.policy_version = 0
        self.rollout = None
        # the native engine over the training model itself, or (fsdp2, LoRA) over its own
        # copy, parked in host memory while the training engine computes
        self.synced = spec.actor.strategy != "torch" or self.lora  # the rollout's copy is synced
        if spec.rollout.engine == "native" and size == 1 and not self.pooled:
            self.rollout = rollout_engine("native").from_spec(
                self.model, tokenizer, spec, self.device, park=self.synced)
        self.loss_fn = policy_loss_fn(spec, self.sampling)
        self.start_engine(spec)
        if self.rollout is None and self.world_size == 1 and self.engine is not None \
                and not self.pooled:
            self.start_rollout()

    def on_distributed(self) -> None:
        super().on_distributed()
        if self.rollout is None and not self.pooled:  # an inference engine joins the group
            self.start_rollout()                        # once it exists

    def start_rollout(self) -> None:
        """An inference engine of its own (`rollout.engine: vllm`), or the native engine of a
        rollout group over this rank's parts, given the training engine's weights through the
        same sync as after every update."""
        group = {"group": self.rollout_group, "park": True} if self.rollout_split else {}
        self.rollout = rollout_engine(self.spec.rollout.engine).from_spec(
            self.model, self.tokenizer, self.spec, self.device, model_path=self.model_path,
            **group)
        self.sync_rollout()

    def plain_engine(self) -> Any:
        # LoRA: the engine wraps a copy with adapters; the rollout's model takes merged weights
        model = copy.deepcopy(self.model) if self.lora else self.model
        return training_engine(self.spec.actor.strategy).from_spec(
            model, self.spec.actor, self.total_steps, self.spec.model.dtype, self.device)

    def sharded_engine(self, mesh: Any) -> Any:
        # The training engine shards its own copy, given on the host; the native rollout keeps
        # the full model, synced from the shards after every update (vLLM loads them itself).
        if next(self.model.parameters()).device.type == "cpu" and not self.rollout_split:
            source = copy.deepcopy(self.model)
        else:
            source, _ = load_policy(self.spec, self.base_path, torch.device("cpu"))
        return training_engine("fsdp2").from_spec(
            source, self.spec.actor, self.total_steps, self.spec.model.dtype, mesh, **self.groups)

    def megatron_engine(self) -> Any:
        # Megatron-Core's chunks convert the folder's weights themselves; the full model
        # loaded here is the native rollout's copy (or the template of the saved folder)
        from rl_core.engines.megatron import MegatronEngine

        return MegatronEngine.from_spec(megatron_folder(self.spec, self.model_path), self.spec,
                                        self.total_steps)

    # ----------------------------------------------------------------------- rollout

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int = 0,
                 row_range: tuple[int, int] | None = None, total_rows: int | None = None
                 ) -> Batch | None:
        """Sample the prompts; the draws are rows `row_range` of the whole batch's table
        (`total_rows` rows, seeded by `seed`), so the shards of a batch equal the batch."""
        return generate_rows(self, prompt_ids, params, seed, row_range, total_rows)

    def free_cache(self) -> None:
        if self.rollout is not None:
            self.rollout.free_cache()

    # ----------------------------------------------------------------------- a rollout pool

    def link_address(self) -> tuple[str, int]:
        """Rank 0: where the link to a rollout pool of its own is served (this host, a free
        port)."""
        return self.rendezvous()

    def join_link(self, host: str, port: int, size: int) -> None:
        """Rank 0 joins the link to the rollout pool as its rank 0 (the sender); the other
        ranks only gather the buckets with it."""
        if self.rank == 0:
            self.link = open_link(self.spec, host, port, 0, size)

    def send_weights(self) -> dict[str, float]:
        """The policy's weights to the rollout pool, bucket by bucket (every rank iterates the
        buckets, which it gathers with its peers; rank 0 sends them), as the current version.

        With rollouts ahead of the update (`trainer.max_staleness` > 0) the pool takes them
        only after the batches it is generating: rank 0 keeps a host copy and a thread sends
        it, so the actor goes on at once (the next send first waits for this one)."""
        import time

        from rl_core.rollout.transfer import send_weights

        started = time.perf_counter()
        self.wait_sent()
        buckets = self.engine.weight_buckets()
        with self.measured("weight_sync"):
            if self.spec.trainer.max_staleness and self.link is not None:
                copies = [[(name, tensor.detach().to("cpu", copy=True)) for name, tensor in bucket]
                          for bucket in buckets]  # gathered with the other ranks, as they go
                sent = sum(t.numel() * t.element_size() for bucket in copies for _, t in bucket)
                self.sending = WeightSender(self.link, copies, self.policy_version)
            else:
                sent = send_weights(self.link, buckets, self.policy_version)
        return {"timing/weight_sync": time.perf_counter() - started,
                "rollout/weight_sync_bytes": float(sent)} if self.rank == 0 else {}

    def wait_sent(self) -> None:
        """Wait for the weights a thread is sending to the pool (a failure raises here)."""
        if self.sending is not None:
            sending, self.sending = self.sending, None
            sending.wait()

    # ----------------------------------------------------------------------- log-probs, update

    def compute(self, stage: str, chunk: Any) -> dict[str, Any]:
        if stage == "ref_logprob":
            return {"ref_logprobs": self.ref_logprobs(chunk.columns)}
        if stage != "old_logprob":
            return super().compute(stage, chunk)
        return {"old_logprobs": self.old_logprobs(chunk.columns)}

    def ref_logprobs(self, cols: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """LoRA (`actor.lora`): the reference's log-probs, the policy's own forward with its
        adapters off, which is the frozen base (no reference role is started). Sharded, every
        rank's share at once, as `old_logprobs`."""
        if not self.lora:
            raise InputError("ref_logprob: the actor computes the reference's log-probs only "
                             "with actor.lora (otherwise the reference role does)")
        with self.engine.adapters_off():
            return self._logprobs("ref_logprob", cols,
                                  self.spec.reference.log_prob_micro_batch_size)

    def old_logprobs(self, cols: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Log-probs of the responses under the current policy. A sharded actor is called on
        every rank's share at once (its forward is a collective: it cannot pull channel chunks)."""
        return self._logprobs("old_logprob", cols, self.spec.rollout.log_prob_micro_batch_size)

    def _logprobs(self, stage: str, cols: Mapping[str, torch.Tensor],
                  micro_batch_size: int) -> torch.Tensor:
        """The responses' log-probs under the training engine's weights as they are, measured
        as `stage`."""
        self.rest_rollout()
        with self.measured(stage):
            logprobs, _ = self.engine.forward_logprobs(
                cols["input_ids"], cols["attention_mask"], cols["position_ids"],
                cols["response_mask"].shape[1], temperature=temperature_of(self.sampling),
                micro_batch_size=micro_batch_size, images=images_of(cols))
        return logprobs.cpu()

    def update(self, minis: list[dict[str, torch.Tensor]], step: int) -> list[dict[str, float]]:
        """One optimizer step per mini-batch shard (this rank's rows of each mini-batch), then
        the new policy's weights into the rollout."""
        self.rest_rollout()
        out = []
        with self.measured("update"):
            for mini in minis:
                try:
                    out.append(self.engine.train_step(
                        mini, self.loss_fn, micro_batch_size=self.spec.actor.ppo_micro_batch_size,
                        loss_agg_mode=self.spec.actor.loss_agg_mode,
                        temperature=temperature_of(self.sampling), with_entropy=True))
                except NonFiniteError as exc:
                    raise TrainingStopped(step, str(exc), exc.metrics) from exc
        self.policy_version += 1
        out[-1].update(self.sync_rollout())
        return out

    def train_step(self, batch: dict[str, Any], loss_fn: Callable,
                   options: Mapping[str, Any] | None = None, step: int = 0) -> dict[str, float]:
        """A step with another loss (DPO): the engine's `train_step` on this rank's rows."""
        self.rest_rollout()
        try:
            with self.measured("update"):
                metrics = self.engine.train_step(batch, loss_fn, **dict(options or {}))
        except NonFiniteError as exc:
            raise TrainingStopped(step, str(exc), exc.metrics) from exc
        self.policy_version += 1
        return {**metrics, **self.sync_rollout()}

    def rest_rollout(self) -> None:
        """Before the training engine computes: the rollout's memory back (none in a pool)."""
        if self.rollout is not None:
            self.rollout.sleep()

    def sync_rollout(self) -> dict[str, float]:
        """The training engine's weights into the rollout, bucket by bucket, as the current
        policy version (`timing/weight_sync`): a sharded engine's into the native rollout's full
        model, any engine's into an inference engine, over the link to a rollout pool of its own
        (whose ranks the controller has receiving); nothing to do when the rollout reads the
        training model itself."""
        if self.pooled:
            return self.send_weights()
        if self.rollout.shares_weights and not self.synced:
            return {}
        import time

        started = time.perf_counter()
        self.rollout.wake_up()
        with self.measured("weight_sync"):
            split = {"keep_split": is_split} if self.spec.parallel.resharding == "none" else {}
            self.rollout.load_weights(self.engine.weight_buckets(**split),
                                      version=self.policy_version)
        return {"timing/weight_sync": time.perf_counter() - started}

    def shutdown(self) -> None:
        try:
            self.wait_sent()  # the last weights, which the pool takes at its last call
        except RuntimeError:
            log.exception("the rollout pool did not take the last weights")
        close = getattr(self.rollout, "close", None)
        if close is not None:
            close()
        super().shutdown()

    # ----------------------------------------------------------------------- checkpoints

    def save_model(self, path: str) -> None:
        """The policy as a Hugging Face folder (sharded or LoRA: the rollout's full copy, which
        holds the trained, merged weights since the last sync) and, sharded, the float32 master
        weights (LoRA: the adapters) and the optimizer state under `dcp/actor`, each rank
        writing its part. LoRA: the adapters also in PEFT's format under `adapter/`."""
        if self.sharded:
            self.engine.save_sharded(Path(path) / SHARDED_DIRS["actor"])
        adapters = self.engine.adapter_state() if self.lora else None  # sharded: a collective
        # the full model holds the trained weights only where the native rollout is synced
        full = None
        if self.synced and (self.pooled or not self.rollout.shares_weights
                            or self.rollout_split):
            dtype = next(self.model.parameters()).dtype
            full = {name: tensor.to(dtype)  # a collective: every rank gathers
                    for name, tensor in self.engine.full_state_dict().items()}
        if self.rank == 0:
            self.model.save_pretrained(path, safe_serialization=True, state_dict=full)
            self.tokenizer.save_pretrained(path)
            copy_processor_files(self.model_path, path)
            if adapters is not None:
                save_adapters(self.engine.model, Path(path) / ADAPTER_DIR, adapters)

    def state(self) -> dict[str, Any]:
        return {"engine": host_copy(self.engine.state_dict()), "rng": rng_state(),
                "policy_version": self.policy_version}

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore `state()`; sharded, also the shards of checkpoint `state["checkpoint"]`
        (saved by any number of ranks), then the rollout takes the restored weights."""
        self.engine.load_state_dict(state["engine"])
        self.policy_version = int(state.get("policy_version", self.policy_version))
        if self.sharded:
            self.engine.load_sharded(Path(state["checkpoint"]) / SHARDED_DIRS["actor"])
        self.sync_rollout()
        set_rng_state(state["rng"])


def generate_rows(owner: Any, prompt_ids: list[list[int]], params: SamplingParams, seed: int,
                  row_range: tuple[int, int] | None, total_rows: int | None) -> Batch | None:
    """Sample the prompts with `owner`'s rollout engine (an actor rank's, or a rollout pool
    rank's): an engine of its own from per-prompt seeds (checked to hold `owner`'s policy
    version, which each row records), the native engine over the training weights from rows
    `row_range` of the whole batch's draw table (`total_rows` rows, seeded by `seed`), so the
    shards of a batch equal the batch. None for a rank left without prompts."""
    if not prompt_ids:  # a batch smaller than the ranks
        return None
    rollout = owner.rollout
    if not rollout.shares_weights:
        rollout.check_version(owner.policy_version)
        first = row_range[0] // params.n if row_range else 0
        seeds = [prompt_seed(seed, first + i) for i in range(len(prompt_ids))]
        with owner.measured("rollout"):
            batch = rollout.generate(prompt_ids, params, seeds=seeds).to("cpu")
        batch["weight_version"] = torch.full((len(batch),), owner.policy_version)
        return batch
    uniforms = None
    if params.do_sample:
        rows = total_rows if total_rows is not None else len(prompt_ids) * params.n
        generator = torch.Generator().manual_seed(seed)
        uniforms = draw_uniforms(rows, params.max_new_tokens, generator, row_range=row_range,
                                 device=owner.device)
    with owner.measured("rollout"):
        return rollout.generate(prompt_ids, params, uniforms=uniforms).to("cpu")


def prompt_seed(step_seed: int, prompt: int) -> int:
    """The sampling seed of prompt `prompt` (its index in the whole batch) of a step: the same
    on any number of ranks, distinct across prompts and steps."""
    import hashlib

    digest = hashlib.blake2b(f"{step_seed}:{prompt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def policy_loss_fn(spec: RunSpec, sampling: SamplingParams) -> Callable:
    """The PPO-clip (or GSPO) objective with the entropy bonus and the KL loss of the spec."""
    actor, name = spec.actor, spec.actor.policy_loss
    policy_loss = algos.get_policy_loss(name)
    clip = {"clip_ratio_low": actor.clip_ratio_low, "clip_ratio_high": actor.clip_ratio_high}
    if name == "vanilla":
        clip["clip_ratio_c"] = actor.clip_ratio_c
    mode = actor.loss_agg_mode
    norm_len = sampling.max_new_tokens

    def loss_fn(mb: dict[str, torch.Tensor], logprobs: torch.Tensor, entropy: torch.Tensor | None):
        mask = mb["response_mask"]
        old = mb["old_logprobs"] if "old_logprobs" in mb else logprobs.detach()
        advantages = mb["advantages"]
        if "rollout_is_weights" in mb:  # truncated IS: the losses are 1-homogeneous in A
            advantages = advantages * mb["rollout_is_weights"]
        pg_loss, m = policy_loss(old, logprobs, advantages, mask, loss_agg_mode=mode,
                                 norm_len=norm_len, **clip)
        loss = pg_loss
        metrics = {"actor/pg_loss": pg_loss.detach(), "actor/pg_clipfrac": m["pg_clipfrac"],
                   "actor/ppo_kl": m["ppo_kl"]}
        if entropy is not None:
            ent = algos.agg_loss(entropy, mask, mode, norm_len=norm_len)
            loss = loss - actor.entropy_coeff * ent
            metrics["actor/entropy"] = ent.detach()
        if actor.use_kl_loss and "ref_logprobs" in mb:
            kl = algos.kl_loss(logprobs, mb["ref_logprobs"], mask, actor.kl_loss_type,
                               loss_agg_mode=mode, norm_len=norm_len)
            loss = loss + actor.kl_loss_coef * kl
            metrics["actor/kl_loss"] = kl.detach()
        return loss, metrics

    return loss_fn


# --------------------------------------------------------------------------- a rollout pool


class WeightSender:
    """A thread sending a host copy of the weights over the link to a rollout pool (as
    `rl_core.rollout.transfer.send_weights`), while the actor goes on."""

    def __init__(self, link: Any, buckets: list[Any], version: int) -> None:
        import threading

        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._send, args=(link, buckets, version),
                                       name="weights-to-pool", daemon=True)
        self.thread.start()

    def _send(self, link: Any, buckets: list[Any], version: int) -> None:
        from rl_core.rollout.transfer import send_weights

        try:
            send_weights(link, buckets, version)
        except BaseException as exc:  # noqa: BLE001 - raised in the actor's thread by wait()
            self.error = exc

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"sending the weights to the rollout pool failed: "
                               f"{self.error}") from self.error


def open_link(spec: RunSpec, host: str, port: int, rank: int, size: int) -> Any:
    """Rank `rank` of the link between the actor's rank 0 and a rollout pool, on the backend
    of the spec's devices."""
    from rl_core.collectives import Link
    from rl_core.device import get_kind

    return Link(host, port, rank, size, get_kind(spec.resources.device_type).backend)


class RolloutWorker(Worker):
    """A rank of a rollout pool of its own (`parallel.colocate_actor_rollout: false`): a copy of
    the policy and its rollout engine on a device that only generates. The weights arrive from
    the actor's rank 0 over a link of their own after every update (`rl_core.rollout.transfer`),
    as the version the actor sends."""

    role = "rollout"

    def __init__(self, spec: RunSpec, *, model_path: str, rank: int = 0, world_size: int = 1,
                 device: str | None = None):
        super().__init__(rank, world_size)
        self.spec = spec = with_resolved_engine(spec)
        self.device = role_device(spec, device)
        seed_everything(spec.seed, spec.trainer.deterministic)  # its own process on Ray
        # the native engine generates from this copy; vLLM takes its own from it
        home = self.device if spec.rollout.engine == "native" else torch.device("cpu")
        self.model, self.tokenizer = load_policy(spec, model_path, home)
        self.model_path = model_path
        self.policy_version = 0  # the initial policy until the first weights arrive
        self.rollout = None
        self.link = None
        if world_size == 1:
            self.start_rollout()

    def on_distributed(self) -> None:
        super().on_distributed()
        if self.rollout is None:  # vLLM joins the pool's process group once it exists
            self.start_rollout()

    def start_rollout(self) -> None:
        self.rollout = rollout_engine(self.spec.rollout.engine).from_spec(
            self.model, self.tokenizer, self.spec, self.device, model_path=self.model_path)

    def join_link(self, host: str, port: int, size: int) -> None:
        """Join the link to the actor's rank 0 as link rank 1 + this rank."""
        self.link = open_link(self.spec, host, port, 1 + self.rank, size)

    def receive_weights(self) -> dict[str, float]:
        """The policy's weights from the actor's rank 0, bucket by bucket, into the engine; then
        this rank generates as the version they carry."""
        import time

        from rl_core.rollout.transfer import receive_weights

        incoming = receive_weights(self.link, device=self.device)
        with self.measured("weight_sync"):
            self.rollout.load_weights(incoming, version=None)
        self.policy_version = int(incoming.version)
        if not self.rollout.shares_weights:
            self.rollout.weight_version = self.policy_version
        # from the first bucket's manifest: the wait for the update before it is not counted
        return {"timing/weight_receive": time.perf_counter() - incoming.arrived}

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams, seed: int = 0,
                 row_range: tuple[int, int] | None = None, total_rows: int | None = None
                 ) -> Batch | None:
        """As `ActorWorker.generate`, from the weights last received; each row also carries
        their policy version and the seconds this rank generated
        (`rl_core.rollout.ahead.BUSY_COLUMN`)."""
        import time

        from rl_core.rollout.ahead import BUSY_COLUMN

        started = time.perf_counter()
        batch = generate_rows(self, prompt_ids, params, seed, row_range, total_rows)
        if batch is not None:
            batch[BUSY_COLUMN] = torch.full((len(batch),), time.perf_counter() - started)
            # the version received last (an engine over this copy does not record it itself)
            batch["weight_version"] = torch.full((len(batch),), self.policy_version)
        return batch

    def free_cache(self) -> None:
        """Nothing to free: this device only generates."""

    def shutdown(self) -> None:
        close = getattr(self.rollout, "close", None)
        if close is not None:
            close()
        super().shutdown()


# --------------------------------------------------------------------------- reference


class ReferenceWorker(Worker):
    """The frozen initial policy. With `actor.strategy: fsdp2` its parameters are sharded over
    the ranks too (no gradients, no optimizer state) and its stage is called on every rank's
    share at once, as the sharded actor's."""

    role = "reference"

    def __init__(self, spec: RunSpec, *, sampling: SamplingParams, rank: int = 0,
                 world_size: int = 1, device: str | None = None, model=None):
        super().__init__(rank, world_size)
        self.spec = spec
        self.device = role_device(spec, device)
        seed_everything(spec.seed, spec.trainer.deterministic)  # its own process on Ray
        self.sharded = spec.actor.strategy != "torch"
        self.offload = spec.reference.offload and self.device.type != "cpu"
        home = torch.device("cpu") if self.offload or self.sharded else self.device
        self.temperature = temperature_of(sampling)
        if spec.actor.strategy == "megatron":  # Megatron's chunks load the folder themselves
            from transformers import AutoConfig

            self.model = None
            join_layout(self, spec, AutoConfig.from_pretrained(megatron_folder(spec)))
            self.engine = None
            if world_size == 1:
                self.init_alone(role_backend(spec))
            return
        if model is None:
            model, _ = load_policy(spec, spec.model.path, home)
        self.model = model.to(home).eval().requires_grad_(False)
        join_layout(self, spec, self.model.config)
        self.engine = None
        if self.sharded and world_size == 1:
            self.init_alone(role_backend(spec))

    def on_distributed(self) -> None:
        if self.spec.actor.strategy == "megatron":
            from rl_core.engines.megatron import MegatronEngine

            self.engine = MegatronEngine.frozen(megatron_folder(self.spec), self.spec)
            if self.offload:  # in host memory outside its stage
                self.engine.offload()
            return
        groups = context_options(self)
        if not self.sharded:
            if groups:  # a forward over the group's shares: an engine of its own
                self.engine = TrainEngine(self.model, lr=0.0, device=self.device,
                                          param_dtype=self.spec.model.dtype, **groups,
                                          **batch_options(self.spec.actor))
                self.model.to(torch.device("cpu") if self.offload else self.device)
            return
        from rl_core.engines.fsdp import FSDP2Engine

        # sharded in place: the model is the reference's own (loaded on the host, or a copy)
        self.engine = FSDP2Engine.frozen(self.model, mesh=role_mesh(self),
                                         param_dtype=self.spec.model.dtype,
                                         offload=self.offload, **groups,
                                         **batch_options(self.spec.actor))
        self.model = self.engine.model

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        if self.offload and self.spec.actor.strategy == "megatron":
            self.engine.reload()
            try:
                yield
            finally:
                self.engine.offload()
            return
        if not self.offload or self.sharded:  # sharded: FSDP2 brings each layer over in turn
            yield
            return
        from rl_core import device as devices

        self.model.to(self.device)
        try:
            yield
        finally:
            self.model.to("cpu")
            devices.empty_cache(self.device)

    def compute(self, stage: str, chunk: Any) -> dict[str, Any]:
        if stage != "ref_logprob":
            return super().compute(stage, chunk)
        with self.measured("ref_logprob"), self._on_device():
            return {"ref_logprobs": sequence_logprobs(
                self.model, chunk.columns, self.temperature,
                self.spec.reference.log_prob_micro_batch_size, **batch_options(self.spec.actor))}

    def ref_logprobs(self, cols: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The `ref_logprob` stage of a sharded or context-parallel reference on this rank's
        share (all ranks at once: its forward is a collective)."""
        with self.measured("ref_logprob"), self._on_device():
            logprobs, _ = self.engine.forward_logprobs(
                cols["input_ids"], cols["attention_mask"], cols["position_ids"],
                cols["response_mask"].shape[1], temperature=self.temperature,
                micro_batch_size=self.spec.reference.log_prob_micro_batch_size,
                images=images_of(cols))
        return logprobs.cpu()


# --------------------------------------------------------------------------- reward


class RewardWorker(Worker):
    """Rule rewards of decoded responses; CPU only, its functions in a process pool."""

    role = "reward"

    def __init__(self, spec: RunSpec, *, rank: int = 0, world_size: int = 1, tokenizer=None,
                 num_workers: int | None = None):
        super().__init__(rank, world_size)
        from rl_core.rewards import RewardComposer

        seed_everything(spec.seed, spec.trainer.deterministic)  # its own process on Ray

        if tokenizer is None:
            from rl_core.models.loading import load_tokenizer

            tokenizer = load_tokenizer(spec.model.tokenizer_path or spec.model.path,
                                       trust_remote_code=spec.model.trust_remote_code)
        self.tokenizer = tokenizer
        self.composer = RewardComposer.from_config(spec.reward, num_workers=num_workers)

    def score_names(self) -> list[str]:
        return self.composer.names

    def compute(self, stage: str, chunk: Any) -> dict[str, Any]:
        if stage != "reward":
            return super().compute(stage, chunk)
        cols = chunk.columns
        with self.measured("reward"):
            texts = decode_rows(self.tokenizer, cols["response_ids"], cols["response_lengths"])
            prompts = None
            if self.composer.remote is not None:  # the service is sent the prompts too
                prompts = [self.tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
                           for ids, mask in zip(cols["prompt_ids"], cols["prompt_mask"])]
            scored = self.composer.score_batch(texts, cols["truth"], prompts=prompts)
        self.remote_metrics = scored.remote
        out = {"score": torch.tensor(scored.total, dtype=torch.float32)}
        for name, values in scored.per_function.items():
            out[f"reward_fn/{name}"] = torch.tensor(values, dtype=torch.float32)
        return out

    def score_texts(self, texts: list[str], truths: list[Any], prompts: list[str] | None = None):
        return self.composer.score_batch(texts, truths, prompts=prompts)

    def counters(self) -> dict[str, Any]:
        """Failed calls since the start, and the remote service's figures of the last chunk
        this rank scored (`remote`: latency_mean_s, latency_max_s, failures, retries, mean)."""
        return {"timeouts": self.composer.timeouts, "errors": self.composer.errors,
                "remote": dict(getattr(self, "remote_metrics", {}) or {})}

    def shutdown(self) -> None:
        self.composer.close()
        super().shutdown()


class RewardModelWorker(Worker):
    """A learned reward model (`reward.reward_model`, `rl_core.rewards.model`): frozen, whole on
    each rank's device beside the other roles; its `rm_score` stage scores the channel's rows."""

    role = "reward_model"

    def __init__(self, spec: RunSpec, *, rank: int = 0, world_size: int = 1,
                 device: str | None = None, tokenizer=None):
        super().__init__(rank, world_size)
        from rl_core.rewards.model import RewardModel

        self.spec = spec
        self.device = role_device(spec, device)
        seed_everything(spec.seed, spec.trainer.deterministic)  # its own process on Ray
        if tokenizer is None:
            from rl_core.models.loading import load_tokenizer

            tokenizer = load_tokenizer(spec.model.tokenizer_path or spec.model.path,
                                       trust_remote_code=spec.model.trust_remote_code)
        self.model = RewardModel.load(
            spec.reward.reward_model, device=self.device, dtype=spec.model.dtype,
            micro_batch_size=spec.reward.reward_model_micro_batch_size,
            policy_tokenizer=tokenizer, trust_remote_code=spec.model.trust_remote_code)

    def compute(self, stage: str, chunk: Any) -> dict[str, Any]:
        if stage != "rm_score":
            return super().compute(stage, chunk)
        cols = chunk.columns
        with self.measured("rm_score"):
            return {"rm_score": self.model.score(cols["input_ids"], cols["attention_mask"],
                                                 cols["position_ids"])}


# --------------------------------------------------------------------------- critic


class CriticWorker(TrainedRole):
    """PPO's value model: the policy's (or `critic.model_path`'s) weights with a scalar head,
    trained by the actor's kind of engine (`actor.strategy`: plain, or sharded with FSDP2)."""

    role = "critic"

    def __init__(self, spec: RunSpec, *, total_steps: int, model_path: str | None = None,
                 rank: int = 0, world_size: int = 1, device: str | None = None):
        super().__init__(rank, world_size)
        from transformers import AutoConfig, AutoModelForTokenClassification
        from transformers.utils import logging as hf_logging

        from rl_core.models.loading import resolve_model_path

        self.spec = spec
        self.device = role_device(spec, device)
        seed_everything(spec.seed, spec.trainer.deterministic)
        path = resolve_model_path(model_path or spec.critic.model_path or spec.model.path)
        critic = spec.critic
        if spec.actor.strategy == "megatron":  # Megatron's chunks load the folder themselves
            self.folder, self.model = megatron_folder(spec, str(path)), None
            self.options = {
                "lr": critic.lr, "weight_decay": spec.actor.weight_decay,
                "warmup_steps": critic.warmup_steps, "total_steps": total_steps,
                "grad_clip": spec.actor.grad_clip,
                "micro_batch_size": critic.ppo_micro_batch_size, "loss_agg_mode": "token-mean",
                "metric_prefix": "critic/", **batch_options(spec.actor)}
            self.start_engine(spec, AutoConfig.from_pretrained(self.folder))
            return
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # the new value head is expected, not worth a warning
        try:
            # no dropout before the value head (token classifiers default to 0.1): values must
            # be a function of the weights, the same on every rank and in every pass
            config = AutoConfig.from_pretrained(
                path, num_labels=1, trust_remote_code=spec.model.trust_remote_code)
            config.classifier_dropout = 0.0
            model = AutoModelForTokenClassification.from_pretrained(
                path, config=config, trust_remote_code=spec.model.trust_remote_code,
                dtype=torch.float32)
        finally:
            hf_logging.set_verbosity(verbosity)
        self.options = {
            "head": ValueHead(), "lr": critic.lr, "weight_decay": spec.actor.weight_decay,
            "warmup_steps": critic.warmup_steps, "lr_scheduler": "constant",
            "total_steps": total_steps, "grad_clip": spec.actor.grad_clip,
            "param_dtype": spec.model.dtype, "master_weights": spec.actor.master_weights,
            "micro_batch_size": critic.ppo_micro_batch_size,
            "loss_agg_mode": "token-mean", "metric_prefix": "critic/", **batch_options(spec.actor)}
        self.model = model
        self.start_engine(spec)

    def plain_engine(self) -> Any:
        engine = TrainEngine(self.model, device=self.device, **self.options)
        self.model = engine.model
        return engine

    def sharded_engine(self, mesh: Any) -> Any:
        from rl_core.engines.fsdp import FSDP2Engine

        engine = FSDP2Engine(self.model, mesh=mesh, **self.options, **self.groups)
        self.model = engine.model
        return engine

    def megatron_engine(self) -> Any:
        from rl_core.engines.mcore import MegatronLayout
        from rl_core.engines.megatron import MegatronEngine, recompute_config

        spec = self.spec
        return MegatronEngine(
            self.folder, layout=MegatronLayout.of(spec), param_dtype=spec.model.dtype,
            value=True, seed=spec.seed, recompute=recompute_config(
                spec.actor.recompute, spec.model.gradient_checkpointing),
            **self.options)

    def compute(self, stage: str, chunk: Any) -> dict[str, Any]:
        if stage != "values":
            return super().compute(stage, chunk)
        return {"values": self.values(chunk.columns)}

    def values(self, cols: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Values of the response tokens (0 past each response); sharded, every rank's share
        at once."""
        with self.measured("values"):
            values, _ = self.engine.forward_logprobs(
                cols["input_ids"], cols["attention_mask"], cols["position_ids"],
                cols["response_mask"].shape[1],
                micro_batch_size=self.spec.critic.ppo_micro_batch_size)
        return values.cpu() * cols["response_mask"]

    def update(self, minis: list[dict[str, torch.Tensor]], step: int) -> list[dict[str, float]]:
        cliprange = self.spec.critic.cliprange_value

        def loss_fn(mb, values, _entropy):
            mask = mb["response_mask"]
            loss, m = algos.value_loss(values, mb["values"], mb["returns"], mask, cliprange)
            return loss, {"critic/vf_loss": loss.detach(), "critic/vf_clipfrac": m["vf_clipfrac"],
                          "critic/vpred_mean": algos.masked_mean(values.detach(), mask)}

        out = []
        with self.measured("update"):
            for mini in minis:
                try:
                    out.append(self.engine.train_step(mini, loss_fn))
                except NonFiniteError as exc:
                    raise TrainingStopped(step, f"critic: {exc}", exc.metrics) from exc
        return out

    def save_model(self, path: str) -> None:
        """The value model as a Hugging Face folder under `path` (rank 0); sharded, its full
        weights gathered from every rank first, and its sharded state under `dcp/critic`."""
        state = None
        if self.sharded:
            self.engine.save_sharded(Path(path).parent / SHARDED_DIRS["critic"])
            state = self.engine.full_state_dict()
        if self.rank == 0 and self.model is None:  # megatron: no template model to save from
            save_value_model(self.folder, state, path)
        elif self.rank == 0:
            self.model.save_pretrained(path, safe_serialization=True, state_dict=state)

    def state(self) -> dict[str, Any]:
        return {"engine": host_copy(self.engine.state_dict())}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.engine.load_state_dict(state["engine"])
        if self.sharded:
            self.engine.load_sharded(Path(state["checkpoint"]) / SHARDED_DIRS["critic"])


def save_value_model(source: str, state: Mapping[str, torch.Tensor], path: str) -> None:
    """A value model as a Hugging Face token classifier with one label: the weights `state`
    (the body's and `score.weight`) and the config of the policy folder `source`."""
    from safetensors.torch import save_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, num_labels=1)
    config.classifier_dropout = 0.0  # values a function of the weights (as the critic loads)
    config.architectures = [f"{type(config).__name__.removesuffix('Config')}ForTokenClassification"]
    Path(path).mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    save_file({name: t.contiguous() for name, t in state.items()},
              str(Path(path) / "model.safetensors"), metadata={"format": "pt"})
