"""The single-controller RL loop: GRPO, DAPO, PPO (and Dr.GRPO, RLOO, REINFORCE++).

    trainer = RLTrainer(spec)                  # roles in this process
    trainer = RLTrainer(spec, backend="ray")   # roles as Ray actors on the spec's devices
    summary = trainer.fit()                    # rollout -> stages -> advantages -> updates

The controller holds the data (prompts, loader), the random generator, the KL controller and the
tracker; the roles (`rl_core.roles`) hold the models. One step: the actor's ranks sample
`n_samples_per_prompt` responses for their share of `data.train_batch_size` prompts (the draws
of each row come from one table seeded per step, so the shards equal one whole batch); the batch
goes into the data channel, and the stages that work row by row pull it from there at once:
`reward` (reward workers), `ref_logprob` (reference, when a KL term is on), `old_logprob` (the
actor, skipped when the update is strictly on-policy) and `values` (the critic, PPO). The
controller computes advantages, then the actor (and the critic) update on `ppo_epochs` passes of
mini-batches, each split over the data-parallel ranks. DAPO adds overlong reward shaping and
dynamic sampling (rewards first, then the other stages on the kept groups).

Both backends run this same code: `backend="local"` calls the workers directly, `"ray"` as
actors (see `rl_core.roles.cluster`). With the same seed the two give the same metrics, up to
floating-point rounding, for any number of data-parallel ranks.
"""

from __future__ import annotations

import logging
import math
import random
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rl_core import algos
from rl_core.checkpoint import clean_partial, latest_checkpoint, load_state, save_checkpoint
from rl_core.data.loader import ResumableLoader
from rl_core.data.run_data import load_prompt_data
from rl_core.data.templates import render_prompts
from rl_core.engines.rollout import RolloutBatch, SamplingParams
from rl_core.errors import InputError, TrainingStopped
from rl_core.models.loading import check_model_folder, load_tokenizer, resolve_model_path
from rl_core.roles.group import collect
from rl_core.roles.workers import SEQUENCE_COLUMNS, seed_everything
from rl_core.roles.workers import decode_responses as _decode_rows
from rl_core.spec import RunSpec
from rl_core.tracking import Tracker, make_tracker

log = logging.getLogger("rl_core")

# --------------------------------------------------------------------------- set-up helpers


@dataclass
class Prompts:
    """Tokenized prompts and their ground truths."""

    ids: list[list[int]]
    truths: list[Any]

    def take(self, rows: list[int]) -> Prompts:
        return Prompts([self.ids[i] for i in rows], [self.truths[i] for i in rows])

    def __len__(self) -> int:
        return len(self.ids)


def tokenize_prompts(records, spec: RunSpec, tokenizer, where: str) -> Prompts:
    rendered, skipped = render_prompts(records, spec.data.prompt_template, tokenizer,
                                       max_length=spec.data.max_prompt_length)
    if skipped:
        log.warning("%s: skipped %d prompts longer than data.max_prompt_length=%d tokens",
                    where, skipped, spec.data.max_prompt_length)
    if not rendered:
        raise InputError(f"data: no {where} prompt fits data.max_prompt_length="
                         f"{spec.data.max_prompt_length}: raise it or shorten the prompts")
    ids = [tokenizer.encode(r.text, add_special_tokens=False) for r in rendered]
    return Prompts(ids, [r.record.ground_truth for r in rendered])


def decode_responses(tokenizer, batch: RolloutBatch) -> list[str]:
    return _decode_rows(tokenizer, batch.response_ids, batch.response_lengths)


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The outcome reward on each response's last token. scores (B,), mask (B, R) -> (B, R)."""
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.sum(1) - 1).clamp(min=0).long()
    rewards[torch.arange(len(scores)), last] = scores.float()
    return rewards * response_mask


class Timer:
    """Wall time per named stage of one step, as `timing/<stage>` metrics."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing/{k}": v for k, v in self.seconds.items()}


# --------------------------------------------------------------------------- the trainer

# how long a stage may wait for its inputs in the channel (a stuck upstream stage is a failure)
STAGE_TIMEOUT_S = 3600.0


def shard_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous [start, stop) shares of `total` items over `parts` ranks (the first take one
    more when it does not divide)."""
    base, extra = divmod(total, parts)
    bounds, start = [], 0
    for rank in range(parts):
        stop = start + base + (rank < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def shard_rows(data: dict[str, Any], parts: int) -> list[dict[str, Any]]:
    rows = len(next(iter(data.values())))
    return [{k: v[a:b] for k, v in data.items()} for a, b in shard_bounds(rows, parts)]


def preflight(spec: RunSpec, *, local: bool) -> None:
    """Refuse, before anything loads, a dtype the device kind cannot train in and (in this
    process) devices this host does not have; each message names the field to change."""
    from rl_core import device as devices

    kind = devices.get_kind(spec.resources.device_type)
    if local:
        devices.check_available(kind, spec.resources.devices_per_node)
    if not local and kind.torch_type != "cpu":
        return  # a Ray cluster's devices are not this host's: its ranks check their own
    ok, reason = devices.supports_dtype(kind, spec.model.dtype)
    if not ok:
        raise InputError(f"model.dtype: {spec.model.dtype} cannot train on "
                         f"{spec.resources.device_type} here: {reason}")


class RLTrainer:
    """GRPO / DAPO / PPO (and Dr.GRPO, RLOO, REINFORCE++) with roles local or on Ray."""

    ALGORITHMS = ("grpo", "dapo", "ppo")

    def __init__(self, spec: RunSpec, *, device: str | None = None, tracker: Tracker | None = None,
                 backend: str = "local"):
        if spec.algorithm not in self.ALGORITHMS:
            raise InputError(f"algorithm: {spec.algorithm} is not trained by this trainer; "
                             "use grpo, dapo or ppo (dpo: rl_core.dpo.DPOTrainer)")
        if backend not in ("local", "ray"):
            raise ValueError(f"backend must be local or ray, got {backend!r}")
        if backend == "local" and spec.world_size > 1:
            raise InputError(f"resources: {spec.world_size} devices need the Ray backend "
                             "(python -m rl_core train starts it); or set "
                             "resources.devices_per_node=1")
        self.spec, self.backend = spec, backend
        preflight(spec, local=backend == "local" and device is None)
        self.output_dir = Path(spec.trainer.output_dir)
        seed_everything(spec.seed, spec.trainer.deterministic)
        resume_from = self._resume_checkpoint()
        model_path = str(resume_from) if resume_from else spec.model.path
        check_model_folder(resolve_model_path(model_path),
                           trust_remote_code=spec.model.trust_remote_code)
        self.tokenizer = load_tokenizer(spec.model.tokenizer_path or model_path,
                                        trust_remote_code=spec.model.trust_remote_code)
        self.train, self.val = self._load_data()
        self.loader = ResumableLoader(
            list(range(len(self.train))), spec.data.train_batch_size,
            epochs=None if spec.trainer.total_steps else spec.trainer.total_epochs,
            shuffle=spec.data.shuffle, seed=spec.seed)
        self.total_steps = spec.trainer.total_steps or self.loader.total_steps
        self.sampling = SamplingParams.from_config(spec.rollout)
        adv = spec.advantage
        self.kl_ctrl = algos.make_kl_controller(adv.kl_ctrl, adv.kl_coef, adv.kl_target, adv.kl_horizon)
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.step = 0
        self.roles = self._start_roles(model_path, device, resume_from)
        try:
            if resume_from:
                self._restore(resume_from)
            self.tracker = tracker or make_tracker(spec, self.output_dir)
        except BaseException:
            self.roles.shutdown()
            raise
        self.rollout = _ShardedRollout(self)
        self.rewards = _RewardsView(self)

    def _load_data(self) -> tuple[Any, Prompts | None]:
        """The training items (prompts; DPO: also pairs) and the validation prompts."""
        spec = self.spec
        train_records, val_records = load_prompt_data(spec, cache_dir=self.output_dir / "data")
        train = tokenize_prompts(train_records, spec, self.tokenizer, "training")
        val = tokenize_prompts(val_records, spec, self.tokenizer, "validation") if val_records else None
        return train, val

    def _start_roles(self, model_path: str, device: str | None, resume_from: Path | None):
        from rl_core.roles import cluster

        critic = resume_from / "critic" if resume_from else None
        options = {"model_path": model_path, "total_steps": self.total_steps,
                   "reference": self._needs_reference(),
                   "critic_path": str(critic) if critic and critic.is_dir() else None}
        if self.backend == "ray":
            return cluster.ray_roles(self.spec, **options)
        return cluster.local_roles(self.spec, **options, device=device,
                                   reference_from_policy=resume_from is None)

    @property
    def model(self):
        """The policy model (the local backend only: on Ray it lives in the actor processes)."""
        if not self.roles.local:
            raise AttributeError("the policy lives in the Ray actor processes")
        return self.roles.actor.workers[0].model

    @property
    def dp(self) -> int:
        return self.roles.actor.size

    # ----------------------------------------------------------------------- resume

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

    def _restore(self, checkpoint: Path) -> None:
        state = load_state(checkpoint)
        self.roles.actor.call("load_state", {"engine": state["engine"], "rng": state["rng"]})
        if self.roles.critic is not None and "critic" in state:
            self.roles.critic.call("load_state", state["critic"])
        self.loader.load_state_dict(state["loader"])
        random.setstate(state["controller_rng"])
        self.generator.set_state(state["generator"])
        self.kl_ctrl.value = state["kl_coef"]
        self.step = state["step"]
        log.info("resumed from %s at step %d", checkpoint, self.step)

    def _state(self) -> dict[str, Any]:
        state = {**self.roles.actor.call("state")[0], "loader": self.loader.state_dict(),
                 "controller_rng": random.getstate(), "generator": self.generator.get_state(),
                 "kl_coef": self.kl_ctrl.value}
        if self.roles.critic is not None:
            state["critic"] = self.roles.critic.call("state")[0]
        return state

    def save(self) -> Path:
        def write(folder: Path) -> None:
            self.roles.actor.call("save_model", str(folder))
            if self.roles.critic is not None:
                self.roles.critic.call("save_model", str(folder / "critic"))

        path = save_checkpoint(self.output_dir, self.step, state=self._state(), write=write,
                               spec_yaml=self.spec.to_yaml())
        log.info("saved %s", path)
        return path

    def _needs_reference(self) -> bool:
        s = self.spec
        return s.reference.enable and (s.actor.use_kl_loss or s.advantage.use_kl_in_reward)

    # ----------------------------------------------------------------------- the loop

    def fit(self) -> dict[str, float]:
        """Train until `total_steps`; returns the last logged metrics. The roles are shut
        down at the end, whatever happens."""
        last: dict[str, float] = {}
        status = "FAILED"
        # A progress bar only when a person watches; logs and the platform get metric lines.
        progress = tqdm(total=self.total_steps, initial=self.step, desc=self.spec.algorithm,
                        unit="step", disable=not sys.stderr.isatty(), leave=True)
        try:
            self.tracker.log_params(self.spec.flat_params())
            if self.step == 0 and self.val is not None and self.spec.trainer.eval_every:
                last = self.validate()
                self.tracker.log_metrics(last, step=0)
            while self.step < self.total_steps:
                metrics = self.train_step()
                self.step += 1
                progress.update(1)
                progress.set_postfix({"reward": f"{metrics.get('reward/mean', 0):.3f}"})
                if self._due(self.spec.trainer.eval_every) and self.val is not None:
                    metrics.update(self.validate())
                if self._due(self.spec.trainer.log_every):
                    self.tracker.log_metrics(metrics, step=self.step)
                last = metrics
                if self._due(self.spec.trainer.save_every) and self.step < self.total_steps:
                    self.save()
            self._finish()
            status = "FINISHED"
            return last
        finally:
            progress.close()
            self.close()
            self.tracker.finish(status)

    def close(self) -> None:
        """Stop the roles (their processes, on Ray); the trainer cannot step after this."""
        self.roles.shutdown()

    def _due(self, every: int) -> bool:
        return every > 0 and (self.step % every == 0 or self.step == self.total_steps)

    def _finish(self) -> None:
        """The final checkpoint, also sent to the tracker as an artifact."""
        path = self.save()
        self.tracker.log_artifacts(path, f"checkpoints/{path.name}")

    def train_step(self) -> dict[str, float]:
        timer = Timer()
        with timer("step"):
            with timer("rollout"):
                batch, metrics, columns = self.generate_batch(timer)
            data = self.prepare_update(batch, columns, timer, metrics)
            with timer("update"):
                metrics.update(self.update(data))
        metrics.update(timer.metrics())
        tokens = int(batch.response_mask.sum() + batch.prompt_mask.sum())
        metrics["perf/tokens_per_s"] = tokens / max(timer.seconds["step"], 1e-9)
        metrics["perf/total_tokens"] = float(tokens)
        return metrics

    # ----------------------------------------------------------------------- rollout

    def _next_prompts(self) -> Prompts:
        return self.train.take(next(self.loader))

    def _draw_seed(self) -> int:
        return int(torch.randint(0, 2**62, (1,), generator=self.generator))

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 seed: int | None = None) -> RolloutBatch:
        """Sample the prompts on the actor's ranks (each its contiguous share) as one batch."""
        if seed is None:
            seed = self._draw_seed() if params.do_sample else 0
        total = len(prompt_ids) * params.n
        bounds = shard_bounds(len(prompt_ids), self.dp)
        parts = self.roles.actor.map("generate", [
            (prompt_ids[a:b], params, seed, (a * params.n, b * params.n), total) for a, b in bounds])
        parts = [p for p in parts if p is not None]
        if len(parts) == 1:
            return parts[0]
        return concat_batches([(p, torch.zeros(len(p))) for p in parts], limit_rows=total)[0]

    def generate_batch(self, timer: Timer) -> tuple[RolloutBatch, dict[str, float], dict[str, Any]]:
        """One batch of scored responses (and its stage outputs); with DAPO dynamic sampling,
        only informative groups."""
        dynamic = self.spec.advantage.dynamic_sampling
        if not dynamic.enable:
            prompts = self._next_prompts()
            batch = self.generate(prompts.ids, self.sampling)
            columns, metrics = self._run_stages(batch, prompts.truths, self._stages(), timer)
            scores, more = self._shape_scores(batch, columns)
            metrics.update(more)
            metrics.update(self._batch_metrics(batch, scores))
            columns["score"] = scores
            return batch, metrics, columns
        return self._dynamic_batch(dynamic.max_num_gen_batches, timer)

    def _dynamic_batch(self, max_batches: int, timer: Timer):
        wanted, n = self.spec.data.train_batch_size, self.sampling.n
        kept: list[tuple[RolloutBatch, torch.Tensor]] = []
        kept_truths: list[Any] = []
        all_scores, metrics, groups, rounds = [], {}, 0, 0
        while groups < wanted and (max_batches == 0 or rounds < max_batches):
            rounds += 1
            prompts = self._next_prompts()
            batch = self.generate(prompts.ids, self.sampling)
            columns, metrics = self._run_stages(batch, prompts.truths, ["reward"], timer)
            scores, more = self._shape_scores(batch, columns)
            metrics.update(more)
            all_scores.append(scores)
            keep, count = algos.filter_groups(scores, batch.prompt_index)
            if count:
                kept.append((select_rows(batch, keep), scores[keep]))
                rows = keep.nonzero().squeeze(1).tolist()
                truths = [prompts.truths[i] for i in batch.prompt_index.tolist()]
                kept_truths.extend(truths[r] for r in rows)
                groups += count
        metrics.update({"dapo/num_gen_batches": float(rounds), "dapo/kept_groups": float(min(groups, wanted))})
        scores_seen = torch.cat(all_scores)
        metrics["reward/mean_all"] = float(scores_seen.mean())
        if not kept:
            raise TrainingStopped(
                self.step + 1,
                f"dynamic sampling found no group with differing rewards in {rounds} generation "
                "batches (advantage.dynamic_sampling.max_num_gen_batches): the task is too easy "
                "or too hard for the model; raise the cap, change the data, or disable dynamic "
                "sampling", metrics)
        if groups < wanted:
            log.warning("step %d: dynamic sampling kept %d of %d groups after %d generation batches",
                        self.step + 1, groups, wanted, rounds)
        batch, scores = concat_batches(kept, limit_rows=wanted * n)
        rest = [s for s in self._stages() if s != "reward"]
        columns, stage_metrics = self._run_stages(batch, None, rest, timer,
                                                  extra={"score": scores})
        metrics.update(stage_metrics)
        columns["score"] = scores
        metrics.update(self._batch_metrics(batch, scores))
        return batch, metrics, columns

    # ----------------------------------------------------------------------- stages

    def _stages(self) -> list[str]:
        stages = ["reward"]
        if self.roles.reference is not None:
            stages.append("ref_logprob")
        if not self._on_policy():
            stages.append("old_logprob")
        if self.roles.critic is not None:
            stages.append("values")
        return stages

    def _run_stages(self, batch: RolloutBatch, truths: list[Any] | None, stages: list[str],
                    timer: Timer, extra: dict[str, Any] | None = None
                    ) -> tuple[dict[str, Any], dict[str, float]]:
        """Put the batch into the data channel and let every stage's role pull it at once."""
        from rl_core.data.channel import _call

        input_ids, attention_mask, position_ids = batch.to_sequences()
        columns: dict[str, Any] = {
            "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
            "response_mask": batch.response_mask, "response_ids": batch.response_ids,
            "response_lengths": batch.response_lengths, **(extra or {})}
        if truths is not None:
            columns["truth"] = [truths[i] for i in batch.prompt_index.tolist()]
        channel = self.roles.channel
        _call(channel, "new_batch", len(batch), columns)
        rows = len(batch)
        plan = {
            "reward": (self.roles.reward, ["response_ids", "response_lengths", "truth"],
                       ["score", *(f"reward_fn/{n}" for n in self.rewards.names)]),
            "ref_logprob": (self.roles.reference, list(SEQUENCE_COLUMNS), ["ref_logprobs"]),
            "old_logprob": (self.roles.actor, list(SEQUENCE_COLUMNS), ["old_logprobs"]),
            "values": (self.roles.critic, list(SEQUENCE_COLUMNS), ["values"]),
        }
        started = time.perf_counter()  # (a local group works while it is submitted)
        pending = []
        for stage in stages:
            group, needs, _ = plan[stage]
            chunk = max(1, -(-rows // group.size))
            pending.append((stage, group.submit("drain", channel, stage, needs, chunk,
                                                STAGE_TIMEOUT_S)))
        results = collect(*(p for _, p in pending))
        metrics: dict[str, float] = {}
        for (stage, _), per_rank in zip(pending, results):
            metrics[f"channel/wait_s/{stage}"] = sum(r["wait_s"] for r in per_rank)
            timer.seconds[stage] += max(r.get("seconds", 0.0) for r in per_rank)
        timer.seconds["stages"] += time.perf_counter() - started
        out: dict[str, Any] = {}
        for stage in stages:
            for name in plan[stage][2]:
                out[name] = _call(channel, "column", name)
        return out, metrics

    def _shape_scores(self, batch: RolloutBatch, columns: dict[str, Any]
                      ) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores with overlong shaping; reward metrics; a non-finite score stops the run."""
        scores = columns["score"].float()
        metrics = {f"reward/{name}/mean": float(columns[f"reward_fn/{name}"].mean())
                   for name in self.rewards.names}
        counters = self.roles.reward.call("counters")
        metrics["reward/timeouts"] = float(sum(c["timeouts"] for c in counters))
        metrics["reward/errors"] = float(sum(c["errors"] for c in counters))
        if not torch.isfinite(scores).all():
            raise TrainingStopped(self.step + 1, "a reward is not finite", metrics)
        buffer = self.spec.advantage.overlong_buffer
        if buffer.enable:
            penalty = algos.overlong_penalty(batch.response_lengths, self.sampling.max_new_tokens,
                                             buffer.len, buffer.penalty_factor)
            scores = scores + penalty
            metrics["reward/overlong_penalty"] = float(penalty.mean())
        return scores, metrics

    def _batch_metrics(self, batch: RolloutBatch, scores: torch.Tensor) -> dict[str, float]:
        lengths = batch.response_lengths.float()
        return {
            "reward/mean": float(scores.mean()),
            "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
            "response_length/mean": float(lengths.mean()),
            "response_length/max": float(lengths.max()),
            "response_length/clip_ratio": float((~batch.finished).float().mean()),
        }

    # ----------------------------------------------------------------------- update

    def _on_policy(self) -> bool:
        """One pass over one mini-batch: the old policy is the current one, ratio == 1."""
        rows = self.spec.data.train_batch_size * self.sampling.n
        return self.spec.actor.ppo_epochs == 1 and self._mini_rows() >= rows

    def _mini_rows(self) -> int:
        return self.spec.actor.ppo_mini_batch_size * self.sampling.n

    def prepare_update(self, batch: RolloutBatch, columns: dict[str, Any], timer: Timer,
                       metrics: dict[str, float]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask, position_ids = batch.to_sequences()
        mask = batch.response_mask.float()
        data = {"input_ids": input_ids, "attention_mask": attention_mask,
                "position_ids": position_ids, "response_mask": mask}
        for name in ("old_logprobs", "ref_logprobs", "values"):
            if name in columns:
                data[name] = columns[name].float()
        rewards = token_level_rewards(columns["score"], mask)
        adv = self.spec.advantage
        if adv.use_kl_in_reward:
            old = data.get("old_logprobs", batch.logprobs)
            rewards, current_kl = algos.apply_kl_penalty(rewards, old, data["ref_logprobs"], mask,
                                                         self.kl_ctrl.value, adv.kl_penalty)
            self.kl_ctrl.update(float(current_kl), n_steps=len(batch))
            metrics.update({"actor/reward_kl": float(current_kl), "actor/kl_coef": self.kl_ctrl.value})
        with timer("adv"):
            advantages, returns = algos.compute_advantage(
                adv.adv_estimator, rewards, mask, index=batch.prompt_index,
                values=data.get("values"), **self._advantage_options())
        data["advantages"] = advantages
        if "values" in data:
            data["returns"] = returns
            metrics["critic/values/mean"] = float(algos.masked_mean(data["values"], mask))
            metrics["critic/returns/mean"] = float(algos.masked_mean(returns, mask))
        metrics["critic/advantages/mean"] = float(algos.masked_mean(advantages, mask))
        return data

    def _advantage_options(self) -> dict[str, Any]:
        adv = self.spec.advantage
        name = adv.adv_estimator
        if name == "grpo":
            return {"norm_adv_by_std": adv.norm_adv_by_std_in_grpo}
        if name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
            return {"gamma": adv.gamma}
        if name == "gae":
            return {"gamma": adv.gamma, "lam": adv.lam}
        return {}

    def update(self, data: dict[str, torch.Tensor]) -> dict[str, float]:
        """`ppo_epochs` passes of mini-batches; each mini-batch split over the ranks. The
        critic (PPO) updates at the same time as the actor, on the same mini-batches."""
        rows = data["input_ids"].shape[0]
        per_rank: list[list[dict[str, torch.Tensor]]] = [[] for _ in range(self.dp)]
        for _ in range(self.spec.actor.ppo_epochs):
            order = torch.randperm(rows, generator=self.generator)
            for start in range(0, rows, self._mini_rows()):
                index = order[start:start + self._mini_rows()]
                mini = {k: v[index] for k, v in data.items()}
                for rank, shard in enumerate(shard_rows(mini, self.dp)):
                    per_rank[rank].append(shard)
        step = self.step + 1
        actor_keys = ("input_ids", "attention_mask", "position_ids", "response_mask",
                      "old_logprobs", "ref_logprobs", "advantages")
        calls = [self.roles.actor.submit_map("update", [
            ([{k: v for k, v in m.items() if k in actor_keys} for m in minis], step)
            for minis in per_rank])]
        if self.roles.critic is not None:
            critic_keys = ("input_ids", "attention_mask", "position_ids", "response_mask",
                           "values", "returns")
            calls.append(self.roles.critic.submit_map("update", [
                ([{k: v for k, v in m.items() if k in critic_keys} for m in minis], step)
                for minis in per_rank]))
        results = collect(*calls)
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        for per_group in results:
            for step_metrics in per_group[0]:  # every rank reports the same (all-reduced) values
                for key, value in step_metrics.items():
                    sums[key] += value
                    counts[key] += 1
        return {k: v / counts[k] for k, v in sums.items()}

    # ----------------------------------------------------------------------- validation

    def validate(self) -> dict[str, float]:
        """Greedy accuracy and mean reward on the validation prompts."""
        from rl_core.evaluation import evaluate_prompts

        return evaluate_prompts(self, self.val, prefix="val")


class _ShardedRollout:
    """`generate(ids, params, generator)` over the actor's ranks (what evaluation calls)."""

    def __init__(self, trainer: RLTrainer) -> None:
        self.trainer = trainer

    def generate(self, prompt_ids, params: SamplingParams, generator: torch.Generator | None = None):
        seed = int(torch.randint(0, 2**62, (1,), generator=generator)) if params.do_sample else 0
        return self.trainer.generate(list(prompt_ids), params, seed=seed)


class _RewardsView:
    """`score_batch(texts, truths)` and `names` on the first reward worker."""

    def __init__(self, trainer: RLTrainer) -> None:
        self.group = trainer.roles.reward
        self._names: list[str] | None = None

    @property
    def names(self) -> list[str]:
        if self._names is None:
            self._names = list(self.group.call("score_names")[0])
        return self._names

    def score_batch(self, texts, truths):
        return self.group.call("score_texts", list(texts), list(truths))[0]



def select_rows(batch: RolloutBatch, keep: torch.Tensor) -> RolloutBatch:
    fields = {k: v[keep] for k, v in vars(batch).items()}
    return RolloutBatch(**fields)


def concat_batches(parts: list[tuple[RolloutBatch, torch.Tensor]], limit_rows: int):
    """Join batches of different prompt and response widths; keep the first `limit_rows` rows."""
    pad = 0
    width_p = max(b.prompt_ids.shape[1] for b, _ in parts)
    width_r = max(b.response_ids.shape[1] for b, _ in parts)
    offset, joined = 0, defaultdict(list)
    for batch, _ in parts:
        for key in ("prompt_ids", "prompt_mask"):
            t = getattr(batch, key)
            joined[key].append(torch.nn.functional.pad(t, (width_p - t.shape[1], 0), value=pad))
        for key in ("response_ids", "response_mask", "logprobs"):
            t = getattr(batch, key)
            joined[key].append(torch.nn.functional.pad(t, (0, width_r - t.shape[1]), value=pad))
        # prompt indices must stay distinct across generation rounds
        joined["prompt_index"].append(batch.prompt_index + offset)
        offset += int(batch.prompt_index.max()) + 1
        joined["response_lengths"].append(batch.response_lengths)
        joined["finished"].append(batch.finished)
    fields = {k: torch.cat(v)[:limit_rows] for k, v in joined.items()}
    scores = torch.cat([s for _, s in parts])[:limit_rows]
    return RolloutBatch(**fields), scores


def stable_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Metrics that do not depend on wall time (for exact-resume comparisons)."""
    return {k: v for k, v in metrics.items() if not k.startswith(("timing/", "perf/tokens_per_s"))
            and not (isinstance(v, float) and math.isnan(v))}
