"""The single controller's plumbing: what the RL and DPO recipes share around their own steps.

    ctl = Controller(spec, backend="ray")            # checks, seeds, resume point, tokenizer
    spec = ctl.spec                                  # the spec run: rollout.engine auto resolved
    train, val = ctl.load_prompts()                  # (or the recipe's own items)
    restored = ctl.start(len(train), reference=True)  # loader, roles, tracker; resumed state
    batch = ctl.generate(prompt_ids, ctl.sampling)   # over the actor's ranks, one Batch
    batch, truths, metrics = ctl.generate_partial(buffer, train, groups)  # partial rollout
    batch, metrics = ctl.run_stages(batch, truths, ["reward", "ref_logprob"], timer)
    summary = ctl.fit(train_step, validate, extra_state)

The controller holds the data loader, the random generator, the roles (`rl_core.roles`) and the
tracker; the roles hold the models. A recipe composes one and writes its own step; the
controller never knows which algorithm runs. Both backends run this same code: `backend="local"`
calls the workers directly, `"ray"` as actors (`rl_core.roles.cluster`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rl_core import stopping
from rl_core.checkpoint import (
    clean_partial,
    latest_checkpoint,
    load_state,
    save_checkpoint,
)
from rl_core.data import channel as channels
from rl_core.data.batch import SEQUENCE_COLUMNS, Batch, sequence_columns
from rl_core.data.loader import ResumableLoader
from rl_core.data.partial import PartialRollouts, StepCounts, contexts, rollout_batch
from rl_core.data.prompts import Prompts, tokenize_prompts
from rl_core.data.run_data import load_prompt_data
from rl_core.determinism import process_report, record_determinism, seed_everything
from rl_core.engines.balance import balanced_shares
from rl_core.errors import InputError, StaleWeightsError, TrainingStopped
from rl_core.lineage import record_lineage
from rl_core.rollout import with_resolved_engine
from rl_core.rollout.ahead import BUSY_COLUMN
from rl_core.rollout.sampling import SamplingParams
from rl_core.rollout.turns import MultiTurn
from rl_core.models.loading import (
    check_model_folder,
    is_vision_language,
    load_image_processor,
    load_tokenizer,
    resolve_model_path,
)
from rl_core.precision import PrecisionPlan, StageDumper
from rl_core.profiling import ProfilePlan
from rl_core.roles.group import collect
from rl_core.spec import RunSpec, has_images
from rl_core.tracking import Timer, Tracker, log_tool_files, make_tracker, memory_metrics

log = logging.getLogger("rl_core")

# the stages of sharded roles (actor.strategy fsdp2) and the method each rank runs on its share
SHARDED_STAGES = {"old_logprob": "old_logprobs", "ref_logprob": "ref_logprobs",
                  "values": "values"}

# how long a stage may wait for its inputs in the channel (a stuck upstream stage is a failure)
STAGE_TIMEOUT_S = 3600.0


def preflight(spec: RunSpec, *, local: bool) -> None:
    """Refuse, before anything loads, a dtype the device kind cannot train in, (in this
    process) devices this host does not have and a rollout engine or training engine that is
    not installed; each message names the field to change."""
    from rl_core import device as devices

    kind = devices.get_kind(spec.resources.device_type)
    if spec.actor.strategy == "megatron":  # the run's image has the extra, or nothing starts
        from rl_core.engines.mcore import require_megatron

        require_megatron()
    if local:
        devices.check_available(kind, spec.resources.devices_per_node)
    if not local and kind.torch_type != "cpu":
        return  # a Ray cluster's devices are not this host's: its ranks check their own
    if spec.rollout.engine == "vllm":  # exit 2 naming the extra, before any role starts
        from rl_core.rollout.vllm import import_vllm

        import_vllm()
        check_vllm_share(spec)
    ok, reason = devices.supports_dtype(kind, spec.model.dtype)
    if not ok:
        raise InputError(f"model.dtype: {spec.model.dtype} cannot train on "
                         f"{spec.resources.device_type} here: {reason}")


def check_vllm_share(spec: RunSpec) -> None:
    """An InputError when vLLM's share of an accelerator (`rollout.gpu_memory_utilization`)
    leaves the training state resident beside it no room, by the memory plan (devices of known
    memory only)."""
    from rl_core.memory_plan import GIB, plan

    if spec.resources.device_type == "cpu":
        return
    result = plan(spec)
    if result.fits is False and result.peak_phase == "rollout":
        rollout = result.phase_bytes()["rollout"]
        raise InputError(
            f"rollout.gpu_memory_utilization: {spec.rollout.gpu_memory_utilization} of the device "
            f"for vLLM leaves training no room: the rollout phase needs {rollout / GIB:.1f} GiB "
            f"of {result.usable_bytes / GIB:.1f} usable; lower it (python -m rl_core plan "
            "shows what fits)")


def check_strategy(checkpoint: Path, state: dict[str, Any], spec: RunSpec) -> None:
    """An InputError when the checkpoint's training state was saved by another kind of engine
    (whole, FSDP2's shards, Megatron's) than the spec's `actor.strategy` builds: each keeps it
    differently."""
    engine = state["engine"]
    saved = engine.get("strategy") or ("fsdp2" if engine.get("sharded") else "torch")
    if saved != spec.actor.strategy:
        raise InputError(
            f"actor.strategy: {checkpoint} was saved with actor.strategy={saved}, this run uses "
            f"{spec.actor.strategy}; resume it with {saved}, or start a new run from its weights "
            f"(model.path={checkpoint}, trainer.resume_mode=disable)")


class Controller:
    """Data, roles, checkpoints and the step loop of one run (see the module docstring)."""

    def __init__(self, spec: RunSpec, *, backend: str = "local", device: str | None = None):
        if backend not in ("local", "ray"):
            raise ValueError(f"backend must be local or ray, got {backend!r}")
        if backend == "local" and spec.world_size > 1:
            raise InputError(f"resources: {spec.world_size} devices need the Ray backend "
                             "(python -m rl_core train starts it); or set "
                             "resources.devices_per_node=1")
        # rollout.engine auto made concrete once, here: every role and record reads this spec
        spec = with_resolved_engine(spec)
        self.spec, self.backend, self.device = spec, backend, device
        preflight(spec, local=backend == "local" and device is None)
        self.output_dir = Path(spec.trainer.output_dir)
        seed_everything(spec.seed, spec.trainer.deterministic)
        self.resume_from = self._resume_checkpoint()
        # read before any role starts, so a checkpoint of the other strategy fails at once
        self._resume_state = load_state(self.resume_from) if self.resume_from else None
        if self._resume_state is not None:
            check_strategy(self.resume_from, self._resume_state, spec)
        self.model_path = str(self.resume_from) if self.resume_from else spec.model.path
        check_model_folder(resolve_model_path(self.model_path),
                           trust_remote_code=spec.model.trust_remote_code)
        self.tokenizer = load_tokenizer(spec.model.tokenizer_path or self.model_path,
                                        trust_remote_code=spec.model.trust_remote_code)
        # multi-turn rollouts' tools, built before any role starts (an unknown tool fails here)
        self.turns = MultiTurn.from_spec(spec, self.tokenizer)
        self.step = 0
        self.image_processor: Any = None  # a vision-language run's, once its prompts are read

    def load_prompts(self) -> tuple[Prompts, Prompts | None]:
        """The training prompts and the validation prompts (None without validation data)."""
        spec = self.spec
        train_records, val_records = load_prompt_data(spec, cache_dir=self.output_dir / "data")
        images = None
        if has_images(spec):  # a vision-language model's prompts: its image processor
            images = load_image_processor(self.model_path, spec.model.trust_remote_code) \
                if is_vision_language(self.model_path) else None
            self.image_processor = images
        train = tokenize_prompts(train_records, spec, self.tokenizer, "training", images)
        val = tokenize_prompts(val_records, spec, self.tokenizer, "validation", images) \
            if val_records else None
        return train, val

    def start(self, items: int, *, reference: bool, tracker: Tracker | None = None
              ) -> dict[str, Any] | None:
        """The loader over `items` training items, the roles and the tracker; returns the state
        of the checkpoint resumed from (its recipe-specific keys), None on a fresh start."""
        spec = self.spec
        self.loader = ResumableLoader(
            list(range(items)), spec.data.train_batch_size,
            epochs=None if spec.trainer.total_steps else spec.trainer.total_epochs,
            shuffle=spec.data.shuffle, seed=spec.seed)
        self.total_steps = spec.trainer.total_steps or self.loader.total_steps
        self.sampling = SamplingParams.from_config(spec.rollout)
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.dumper = StageDumper("controller", 0)  # each stage's data in dumped steps
        self.roles = self._start_roles(reference)
        try:
            state = self._restore(self.resume_from, self._resume_state) \
                if self.resume_from else None
            self._resume_state = None
            self.tracker = tracker or make_tracker(spec, self.output_dir)
        except BaseException:
            self.roles.shutdown()
            raise
        self.rollout = ShardedRollout(self)
        self.rewards = RewardsView(self.roles.reward)
        return state

    def _start_roles(self, reference: bool):
        from rl_core.roles import cluster

        critic = self.resume_from / "critic" if self.resume_from else None
        options = {"model_path": self.model_path, "total_steps": self.total_steps,
                   # LoRA: the actor's own base (its adapters off) is the reference
                   "reference": reference and self.spec.actor.lora is None,
                   "sampling": self.sampling,
                   "critic_path": str(critic) if critic and critic.is_dir() else None}
        if self.backend == "ray":
            roles = cluster.ray_roles(self.spec, **options)
            if roles.rollout is not None:
                try:
                    self._link_pool(roles)
                except BaseException:
                    roles.shutdown()
                    raise
            return roles
        return cluster.local_roles(self.spec, **options, device=self.device,
                                   reference_from_policy=self.resume_from is None)

    @staticmethod
    def _link_pool(roles: Any) -> None:
        """Join the actor's rank 0 and a rollout pool of its own by a link (a process group of
        their own) and give the pool the actor's weights (version 0: the engines start from
        the same policy, and vLLM from no weights at all)."""
        size = 1 + roles.rollout.size
        host, port = roles.actor.call("link_address")[0]
        collect(roles.actor.submit_map("join_link", [(host, port, size)] * roles.actor.size),
                roles.rollout.submit("join_link", host, port, size))
        collect(roles.actor.submit("sync_rollout"), roles.rollout.submit("receive_weights"))

    def pool_receives(self) -> Any:
        """The rollout pool's receive of the weights the actor's next call sends (submit it
        beside that call, collect both); None without a pool."""
        pool = self.roles.rollout
        return None if pool is None else pool.submit("receive_weights")

    @property
    def model(self):
        """The policy model (the local backend only: on Ray it lives in the actor processes)."""
        if not self.roles.local:
            raise AttributeError("the policy lives in the Ray actor processes")
        return self.roles.actor.workers[0].model

    @property
    def dp(self) -> int:
        """Data-parallel ranks: groups of ranks holding different rows."""
        return self.roles.actor.size // self.spec.model_parallel_size

    def per_rank(self, shares: list[Any]) -> list[Any]:
        """The `dp` shares, one per data-parallel rank, for every rank of the actor's group:
        the ranks of a context-, tensor- (and pipeline-) parallel block share their rows
        (`RunSpec.data_rank`)."""
        if not shares:  # nothing to hand out (no stage runs on the shares)
            return []
        return [shares[self.spec.data_rank(rank)] for rank in range(self.roles.actor.size)]

    def data_leaders(self) -> list[int]:
        """The first rank of each data-parallel index, in order (whose results stand for
        their block's)."""
        ranks = range(self.roles.actor.size)
        return [min(r for r in ranks if self.spec.data_rank(r) == d) for d in range(self.dp)]

    # ----------------------------------------------------------------------- checkpoints

    def _resume_checkpoint(self) -> Path | None:
        mode = self.spec.trainer.resume_mode
        if mode == "disable":
            return None
        if mode == "resume_path":
            path = Path(self.spec.trainer.resume_path)
            if not path.is_dir():
                raise InputError(f"trainer.resume_path: {path} is not a checkpoint folder")
            return path
        clean_partial(self.output_dir)
        return latest_checkpoint(self.output_dir)

    def _restore(self, checkpoint: Path, state: dict[str, Any]) -> dict[str, Any]:
        receiving = self.pool_receives()  # the restored weights go to the pool too
        self.roles.actor.call("load_state", {
            "engine": state["engine"], "rng": state["rng"], "checkpoint": str(checkpoint),
            # the samples' and the pool's version: the updates taken (checkpoints before it: steps)
            "policy_version": state.get("policy_version", state["step"])})
        if receiving is not None:
            collect(receiving)
        if self.roles.critic is not None and "critic" in state:
            self.roles.critic.call("load_state", {**state["critic"],
                                                  "checkpoint": str(checkpoint)})
        self.loader.load_state_dict(state["loader"])
        random.setstate(state["controller_rng"])
        self.generator.set_state(state["generator"])
        self.step = state["step"]
        log.info("resumed from %s at step %d", checkpoint, self.step)
        return state

    def save(self, extra: dict[str, Any] | None = None) -> Path:
        """A checkpoint of the models and of everything an exact resume needs (`extra`: the
        recipe's own state, handed back by `start`)."""
        state = {**self.roles.actor.call("state")[0], "loader": self.loader.state_dict(),
                 "controller_rng": random.getstate(), "generator": self.generator.get_state(),
                 **(extra or {})}
        if self.roles.critic is not None:
            state["critic"] = self.roles.critic.call("state")[0]

        def write(folder: Path) -> None:
            self.roles.actor.call("save_model", str(folder))
            if self.roles.critic is not None:
                self.roles.critic.call("save_model", str(folder / "critic"))

        path = save_checkpoint(self.output_dir, self.step, state=state, write=write,
                               spec_yaml=self.spec.to_yaml())
        log.info("saved %s", path)
        return path

    # ----------------------------------------------------------------------- the loop

    def fit(self, train_step: Callable[[], dict[str, float]],
            validate: Callable[[], dict[str, float]] | None = None,
            extra_state: Callable[[], dict[str, Any]] = dict) -> dict[str, float]:
        """Run `train_step` until `total_steps`, validating, logging and saving as the spec
        says; returns the last logged metrics. The roles are shut down at the end, whatever
        happens."""
        spec = self.spec
        last: dict[str, float] = {}
        status = "FAILED"
        # A progress bar only when a person watches; logs and the platform get metric lines.
        progress = tqdm(total=self.total_steps, initial=self.step, desc=spec.algorithm,
                        unit="step", disable=not sys.stderr.isatty(), leave=True)
        try:
            self.tracker.log_params(spec.flat_params())
            record_lineage(spec, self.output_dir, self.tracker)
            self.record_determinism()
            if self.step == 0 and validate is not None and spec.trainer.eval_every:
                last = validate()
                self.tracker.log_metrics(last, step=0)
            first_step = self.step
            while self.step < self.total_steps:
                self._stop_if_asked(first_step, extra_state)
                plans = self._begin_tools(self.step + 1)
                metrics = train_step()
                if plans is not None:
                    metrics.update(self._end_tools(*plans))
                if spec.tools.monitor.log_memory:
                    metrics.update(self.memory_metrics())
                self.step += 1
                progress.update(1)
                progress.set_postfix({"reward": f"{metrics.get('reward/mean', 0):.3f}"})
                if self._due(spec.trainer.eval_every) and validate is not None:
                    metrics.update(validate())
                if self._due(spec.trainer.log_every):
                    self.tracker.log_metrics(metrics, step=self.step)
                last = metrics
                if self._due(spec.trainer.save_every) and self.step < self.total_steps:
                    self.save(extra_state())
            path = self.save(extra_state())  # the final checkpoint, also an artifact
            self.tracker.log_artifacts(path, f"checkpoints/{path.name}")
            status = "FINISHED"
            return last
        except stopping.Stopped:
            status = "KILLED"  # asked to stop; a restart goes on in the same tracked run
            raise
        finally:
            progress.close()
            self.stop(status)

    def _stop_if_asked(self, first_step: int, extra_state: Callable[[], dict[str, Any]]) -> None:
        """Between steps: when a stop was asked (rl_core.stopping), save this step unless it is
        saved already (or none was taken since `first_step`), and raise Stopped."""
        if not stopping.requested():
            return
        path = latest_checkpoint(self.output_dir)
        if self.step != first_step and (path is None or path.name != f"step_{self.step}"):
            path = self.save(extra_state())
        raise stopping.Stopped(self.step, str(path) if path is not None else None)

    def record_determinism(self) -> dict[str, Any]:
        """The run's determinism report: the controller's and every rank's seeds, kernel modes
        and variables (`rl_core.determinism.record`)."""
        processes = [process_report("controller", 0), *self._each_rank("determinism")]
        return record_determinism(self.spec, processes, self.output_dir, self.tracker)

    def _each_rank(self, method: str, *args: Any) -> list[Any]:
        """`method` on every rank of every role; the results rank after rank, role after role."""
        return [out for group in self.roles.groups for out in group.call(method, *args)]

    def _begin_tools(self, step: int) -> tuple[ProfilePlan | None, PrecisionPlan | None] | None:
        """Tell every rank whether `step` is profiled or dumped (`tools.*`); the plans, or None
        when neither."""
        profile = ProfilePlan.for_step(self.spec, step)
        precision = PrecisionPlan.for_step(self.spec, step)
        # the controller dumps each stage's data, the whole batch's, whatever the ranks chosen
        self.dumper.begin(dataclasses.replace(precision, ranks=(0,)) if precision else None)
        if profile is None and precision is None:
            return None
        self._each_rank("begin_tools", profile, precision)
        return profile, precision

    def _end_tools(self, profile: ProfilePlan | None,
                   precision: PrecisionPlan | None) -> dict[str, float]:
        """End a profiled or dumped step: every rank stops; the step's traces go to the tracker
        as `profiles/step_<N>/`, its dumps as `precision/step_<N>/`; returns how many files
        each wrote (`profile/traces`, `precision/files`)."""
        written = self._each_rank("begin_tools", None, None)
        traces = [path for rank in written for path in rank["traces"]]
        dumps = [path for rank in written for path in rank["dumps"]] + self.dumper.begin(None)
        return log_tool_files(self.tracker, profile, traces, precision, dumps)

    def dump_data(self, stage: str, tensors: dict[str, Any]) -> None:
        """Save a stage's data (the whole batch's) in a dumped step (`tools.precision`)."""
        if self.dumper.chosen(stage):
            self.dumper.data(stage, tensors)

    def memory_metrics(self) -> dict[str, float]:
        """`memory/<role>/allocated_gb`, `.../peak_gb` and `.../<stage>/peak_gb` of the actor,
        the reference and the critic since the last step: the largest over each role's ranks
        (device memory; on cpu each process's resident set)."""
        out: dict[str, float] = {}
        for role in ("actor", "reference", "critic"):
            group = getattr(self.roles, role)
            if group is not None:
                out.update(memory_metrics(group.call("memory"), role))
        return out

    def close(self) -> None:
        """Stop the roles (their processes, on Ray); nothing can step after this."""
        self.roles.shutdown()

    def stop(self, status: str) -> None:
        """Stop the roles, then end the tracker's run with `status` (also when stopping the
        roles fails: the run must not stay open nor its resource sampler go on)."""
        try:
            self.close()
        finally:
            self.tracker.finish(status)

    def _due(self, every: int) -> bool:
        return every > 0 and (self.step % every == 0 or self.step == self.total_steps)

    # ----------------------------------------------------------------------- rollout, stages

    def draw_seed(self) -> int:
        return int(torch.randint(0, 2**62, (1,), generator=self.generator))

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 seed: int | None = None) -> Batch:
        """Sample the prompts on the actor's ranks (each rollout group its contiguous share,
        every rank of a group the same) as one batch; `prompt_index` counts the prompts of the
        whole call."""
        return self.gathered(self.submit_generate(prompt_ids, params, seed))

    def generate_turns(self, prompt_ids: list[list[int]], params: SamplingParams,
                       seed: int | None = None) -> Batch:
        """`generate`, multi-turn where the run has tools (`rollout.multi_turn`): each turn one
        `generate` of the responses still going (`rl_core.rollout.turns`)."""
        if self.turns is None:
            return self.generate(prompt_ids, params, seed)
        if seed is None:
            seed = self.draw_seed() if params.do_sample else 0
        return self.turns.generate(lambda ids, piece, s: self.generate(ids, piece, s),
                                   prompt_ids, params, seed, self.step)

    def submit_generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                        seed: int | None = None) -> GenerateCall:
        """`generate` without waiting: the ranks' calls are submitted (a pool of its own runs
        them in order with its other calls); `gathered` waits for them and makes the batch."""
        if seed is None:
            seed = self.draw_seed() if params.do_sample else 0
        total = len(prompt_ids) * params.n
        size = self.spec.rollout.tensor_parallel_size
        generating = self.roles.rollout or self.roles.actor  # a pool of its own, or the actor
        shards = Batch({"prompt_ids": list(prompt_ids)}).split(generating.size // size)
        firsts = [sum(len(s) for s in shards[:rank]) for rank in range(len(shards))]
        pending = generating.submit_map("generate", [
            (shard.prompt_ids, params, seed, (first * params.n, (first + len(shard)) * params.n),
             total) for shard, first in zip(shards, firsts) for _ in range(size)])
        return GenerateCall(pending, firsts, size)

    @staticmethod
    def gathered(call: GenerateCall) -> Batch:
        """The batch of a submitted `generate` (waits for its ranks)."""
        parts = collect(call.pending)[0][::call.group_size]
        made = [(part, first) for part, first in zip(parts, call.firsts) if part is not None]
        if len(made) == 1:
            return made[0][0]
        for part, first in made:  # each rank counted its own prompts from 0
            part["prompt_index"] = part["prompt_index"] + first
        versions = {int(part["weight_version"][0]) for part, _ in made if "weight_version" in part}
        if len(versions) > 1:
            raise StaleWeightsError(f"the actor's ranks rolled out from different policy versions "
                             f"{sorted(versions)}: a rank missed a weight sync")
        return Batch.concat([part for part, _ in made])

    def generate_partial(self, buffer: PartialRollouts, prompts: Prompts, groups: int
                         ) -> tuple[Batch, list[Any], dict[str, float]]:
        """Partial rollout (`rl_core.data.partial`): rollout calls of at most `buffer.chunk`
        new tokens per sample until `groups` groups are complete, the waiting samples first and
        new prompts from the loader after them; returns those groups as one rollout batch,
        their ground truths (by `prompt_index`) and the `rollout/partial/*` metrics.

        Each call is one `generate` with n = 1 over the samples' prompts and tokens so far, so
        its rows shard over the actor's ranks and draw from the call's seed as any rollout.
        Multi-turn rollouts (`rl_core.rollout.turns`) come this way too, with split 1: the
        tools answer each turn that ends in a call and the sample goes on in the next call;
        `rollout/turns/*` and `rollout/tools/*` join the metrics."""
        params = dataclasses.replace(self.sampling, n=1, max_new_tokens=buffer.chunk)
        version = self.step  # the policy version: one update per step
        counts = StepCounts()
        while True:
            counts.expired += buffer.expire(version)
            if buffer.ready >= groups:
                break
            items = buffer.draw(buffer.wanted(groups), self.loader)
            buffer.add(items, [prompts.ids[i] for i in items])
            rows = buffer.running()
            if not rows:
                raise InputError(f"data: the training prompts ran out with {buffer.ready} of the "
                                 f"{groups} complete groups a step needs: lower "
                                 "trainer.total_steps or raise trainer.total_epochs")
            room = max(buffer.max_new_tokens - len(s.tokens) for _, s in rows)
            piece = dataclasses.replace(params, max_new_tokens=min(buffer.chunk, room))
            ended, cut = buffer.record(rows, self.generate(contexts(rows), piece), version)
            counts.calls, counts.rows = counts.calls + 1, counts.rows + len(rows)
            counts.ended, counts.cut = counts.ended + ended, counts.cut + cut
        done = buffer.pop(groups)
        batch = rollout_batch(done, self.tokenizer.pad_token_id)
        metrics = counts.metrics(done, buffer.pending) if buffer.partial else {}
        if self.turns is not None:
            metrics.update(self.turns.metrics(batch))
        return batch, [prompts.truths[g.item] for g in done], metrics

    def run_stages(self, batch: Batch, truths: list[Any] | None, stages: list[str],
                   timer: Timer) -> tuple[Batch, dict[str, float]]:
        """Put the batch into the data channel and let every stage's role pull it at once;
        returns the stages' output columns (one Batch) and the channel's wait metrics. With
        `actor.lora` the actor computes `ref_logprob` (its adapters off), after its other
        stages rather than beside them."""
        if "ref_logprob" in stages and len(stages) > 1 and self.roles.reference is None:
            out, metrics = self.run_stages(batch, truths, [s for s in stages
                                                           if s != "ref_logprob"], timer)
            ref, more = self.run_stages(batch, None, ["ref_logprob"], timer)
            return out.update(ref), {**metrics, **more}
        columns = batch.with_sequences().update(batch.select(
            ["response_ids", "response_lengths", "score", "prompt_ids", "prompt_mask"])).to_dict()
        if truths is not None:
            columns["truth"] = [truths[i] for i in batch.prompt_index.tolist()]
        channel = self.roles.channel
        channels.call(channel, "new_batch", len(batch), columns)
        rows = len(batch)
        plan = {
            "reward": (self.roles.reward, ["response_ids", "response_lengths", "truth",
                                           *(("prompt_ids", "prompt_mask")
                                             if self.spec.reward.remote else ())],
                       ["score", *(f"reward_fn/{n}" for n in self.rewards.names)]),
            "rm_score": (self.roles.reward_model, list(SEQUENCE_COLUMNS), ["rm_score"]),
            "ref_logprob": (self.roles.reference or self.roles.actor, sequence_columns(columns),
                            ["ref_logprobs"]),
            "old_logprob": (self.roles.actor, sequence_columns(columns), ["old_logprobs"]),
            "values": (self.roles.critic, list(SEQUENCE_COLUMNS), ["values"]),
        }
        # sharded (or context-parallel) roles' forwards are collectives: they cannot pull
        # chunks from the channel, so their stages are called on every rank's share at once
        # (`SHARDED_STAGES`; the ranks of a context- and tensor-parallel block on one share)
        mp = self.spec.model_parallel_size
        sharded = self.spec.actor.strategy != "torch" or mp > 1
        direct = [s for s in stages if sharded and s in SHARDED_STAGES]
        stages = [s for s in stages if s not in direct]
        started = time.perf_counter()  # (a local group works while it is submitted)
        pending = []
        for stage in stages:
            group, needs, _ = plan[stage]
            chunk = max(1, -(-rows // group.size))
            if self.spec.trainer.deterministic:  # rank r computes rows of span r, always
                spans = [(min(r * chunk, rows), min((r + 1) * chunk, rows))
                         for r in range(group.size)]
                drained = group.submit_map("drain", [
                    (channel, stage, needs, chunk, STAGE_TIMEOUT_S, span) for span in spans])
            else:  # whichever rank is free takes the next rows
                drained = group.submit("drain", channel, stage, needs, chunk, STAGE_TIMEOUT_S)
            pending.append((stage, drained))
        # each rank as many rows and about as many tokens (the stage's rows come back in order)
        parts, order = token_balanced(batch.with_sequences(), self.dp) if direct else ([], None)
        shares = self.per_rank([(part.to_dict(),) for part in parts])
        mapped = []
        for stage in direct:
            stage_started = time.perf_counter()
            group = plan[stage][0]
            mapped.append((stage, stage_started, group.submit_map(SHARDED_STAGES[stage], shares)))
        results = collect(*(p for _, p in pending))
        metrics: dict[str, float] = {}
        for (stage, _), per_rank in zip(pending, results):
            metrics[f"channel/wait_s/{stage}"] = sum(r["wait_s"] for r in per_rank)
            timer.seconds[stage] += max(r.get("seconds", 0.0) for r in per_rank)
        out = Batch({name: channels.call(channel, "column", name)
                     for stage in stages for name in plan[stage][2]})
        for stage, stage_started, pending_map in mapped:
            (column,) = plan[stage][2]
            # one rank of each data-parallel index, in order: rows of `order`
            results = collect(pending_map)[0]
            stacked = torch.cat([results[rank] for rank in self.data_leaders()])
            out[column] = stacked.new_empty(stacked.shape).index_copy_(0, order, stacked)
            timer.seconds[stage] += time.perf_counter() - stage_started
        timer.seconds["stages"] += time.perf_counter() - started
        return out, metrics

    @property
    def reward_stages(self) -> list[str]:
        """The stages that score a batch: the rule rewards, and the reward model's with
        `reward.reward_model`."""
        return ((["reward"] if self.roles.reward is not None else [])
                + (["rm_score"] if self.roles.reward_model is not None else []))

    def scores(self, batch: Batch, columns: Batch, max_new_tokens: int
               ) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores (the rule rewards' sum plus `reward.reward_model_weight` times the reward
        model's) with overlong shaping; reward metrics; a non-finite score stops the run."""
        from rl_core import algos

        scores = columns["score"].float() if "score" in columns else torch.zeros(len(batch))
        metrics = {f"reward/{name}/mean": float(columns[f"reward_fn/{name}"].mean())
                   for name in self.rewards.names}
        if "rm_score" in columns:
            learned = columns["rm_score"].float()
            scores = scores + self.spec.reward.reward_model_weight * learned
            metrics["reward/model/mean"] = float(learned.mean())
            metrics["reward/model/std"] = float(learned.std()) if len(learned) > 1 else 0.0
        if self.roles.reward is not None:
            counters = self.roles.reward.call("counters")
            metrics["reward/timeouts"] = float(sum(c["timeouts"] for c in counters))
            metrics["reward/errors"] = float(sum(c["errors"] for c in counters))
            metrics.update(remote_metrics([c.get("remote") or {} for c in counters]))
        if not torch.isfinite(scores).all():
            raise TrainingStopped(self.step + 1, "a reward is not finite", metrics)
        buffer = self.spec.advantage.overlong_buffer
        if buffer.enable:
            penalty = algos.overlong_penalty(batch.response_lengths, max_new_tokens,
                                             buffer.len, buffer.penalty_factor)
            scores = scores + penalty
            metrics["reward/overlong_penalty"] = float(penalty.mean())
        return scores, metrics

    def validate(self, prompts: Prompts, prefix: str = "val") -> dict[str, float]:
        """Greedy accuracy and mean reward on `prompts` with the actor's ranks."""
        from rl_core.evaluation import evaluate_prompts

        if self.turns is not None:  # the tools' counts of validation are its own
            self.turns.metrics()
        metrics = evaluate_prompts(self.rollout, self.tokenizer, self.rewards, prompts,
                                   self.sampling, batch_size=self.spec.data.val_batch_size,
                                   seed=self.spec.seed, prefix=prefix)
        if self.turns is not None:  # val/tools/call_rate, val/tools/status/ok, ...
            metrics.update({f"{prefix}/{key.split('/', 1)[1]}": value
                            for key, value in self.turns.metrics().items()})
        return metrics


def remote_metrics(ranks: list[dict[str, float]]) -> dict[str, float]:
    """`reward/remote/*` of the reward ranks' last chunks: failures and retries summed, the
    slowest call, the mean latency and score over the ranks that called the service."""
    ranks = [r for r in ranks if r]
    if not ranks:
        return {}
    mean = lambda key: sum(r[key] for r in ranks) / len(ranks)  # noqa: E731
    return {"reward/remote/failures": float(sum(r["failures"] for r in ranks)),
            "reward/remote/retries": float(sum(r["retries"] for r in ranks)),
            "reward/remote/latency_max_s": max(r["latency_max_s"] for r in ranks),
            "reward/remote/latency_mean_s": mean("latency_mean_s")}


def token_balanced(batch: Batch, parts: int) -> tuple[list[Batch], torch.Tensor]:
    """The rows of `batch` (with an attention_mask) for each of `parts` data-parallel ranks:
    as many rows each, their tokens balanced by Karmarkar–Karp, so no rank waits for one
    holding the long responses; and the row order of the parts one after another."""
    rows = balanced_shares(batch["attention_mask"].sum(1).tolist(), parts)
    return [batch.take(r) for r in rows], torch.tensor([i for r in rows for i in r])


def batch_metrics(batch: Batch, scores: torch.Tensor) -> dict[str, float]:
    """Reward and response-length statistics of a scored rollout batch."""
    lengths = batch.response_lengths.float()
    return {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
        "response_length/clip_ratio": float((~batch.finished).float().mean()),
        **({"rollout/weight_version": float(batch["weight_version"].max())}
           if "weight_version" in batch else {}),
        # a rollout pool of its own: how long its busiest rank generated this batch
        **({"timing/rollout_busy": float(batch[BUSY_COLUMN].max())}
           if BUSY_COLUMN in batch else {}),
    }


@dataclasses.dataclass
class GenerateCall:
    """A submitted `Controller.generate`: the ranks' calls, the first prompt of each data
    share, and the ranks per rollout group (which return the same rows)."""

    pending: Any
    firsts: list[int]
    group_size: int


class ShardedRollout:
    """The actor's ranks as one rollout engine: `generate(ids, params, generator)`."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def generate(self, prompt_ids, params: SamplingParams, generator: torch.Generator | None = None):
        seed = int(torch.randint(0, 2**62, (1,), generator=generator)) if params.do_sample else 0
        return self.controller.generate_turns(list(prompt_ids), params, seed=seed)


class RewardsView:
    """`score_batch(texts, truths)` and `names` on the first reward worker (None: no rule
    rewards, the reward model alone)."""

    def __init__(self, group) -> None:
        self.group = group
        self._names: list[str] | None = None

    @property
    def names(self) -> list[str]:
        """The reward functions' names; none without a reward worker (a reward model alone)."""
        if self._names is None:
            self._names = [] if self.group is None else list(self.group.call("score_names")[0])
        return self._names

    def score_batch(self, texts, truths, prompts=None):
        return self.group.call("score_texts", list(texts), list(truths),
                               None if prompts is None else list(prompts))[0]
