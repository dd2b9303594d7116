"""The single-controller RL loop for outcome-reward algorithms (GRPO, DAPO and their variants).

    trainer = RLTrainer(spec)          # loads model, data, rewards; resumes when asked
    summary = trainer.fit()            # rollout -> rewards -> log-probs -> advantages -> updates

One step: sample `n_samples_per_prompt` responses for `data.train_batch_size` prompts with the
native rollout engine (the training weights, in this process), score them with the rule rewards,
compute reference log-probs (when a KL term is on) and old log-probs (skipped when the update is
strictly on-policy), advantages, then `ppo_epochs` passes of mini-batch updates. DAPO adds
overlong reward shaping and dynamic sampling. Metrics use the names of docs/metrics.md.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rl_core import algos
from rl_core.checkpoint import (
    clean_partial,
    latest_checkpoint,
    load_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from rl_core.data.loader import ResumableLoader
from rl_core.data.run_data import load_prompt_data
from rl_core.data.templates import render_prompts
from rl_core.engines.rollout import NativeRolloutEngine, RolloutBatch, SamplingParams
from rl_core.engines.train import NonFiniteError, TrainEngine, split_rows, token_logprobs
from rl_core.errors import InputError, TrainingStopped
from rl_core.models.loading import load_model_and_tokenizer
from rl_core.rewards import RewardComposer
from rl_core.spec import RunSpec
from rl_core.tracking import Tracker, make_tracker

log = logging.getLogger("rl_core")

# --------------------------------------------------------------------------- set-up helpers


def seed_everything(seed: int, deterministic: bool) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)


def eos_ids(tokenizer, model) -> list[int]:
    ids = {tokenizer.eos_token_id}
    configured = getattr(model.generation_config, "eos_token_id", None)
    ids.update(configured if isinstance(configured, list) else [configured])
    return sorted(i for i in ids if i is not None)


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
    lengths = batch.response_lengths.tolist()
    rows = [batch.response_ids[i, :n].tolist() for i, n in enumerate(lengths)]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The outcome reward on each response's last token. scores (B,), mask (B, R) -> (B, R)."""
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    last = (response_mask.sum(1) - 1).clamp(min=0).long()
    rewards[torch.arange(len(scores)), last] = scores.float()
    return rewards * response_mask


@torch.no_grad()
def sequence_logprobs(model, input_ids, attention_mask, position_ids, response_len: int, *,
                      temperature: float = 1.0, micro_batch_size: int | None = None) -> torch.Tensor:
    """Log-probs (B, R) of the last `response_len` tokens under a frozen model (the reference)."""
    outs = []
    for rows in split_rows(len(input_ids), micro_batch_size or len(input_ids)):
        out = model(input_ids=input_ids[rows], attention_mask=attention_mask[rows],
                    position_ids=position_ids[rows], use_cache=False, logits_to_keep=response_len + 1)
        labels = input_ids[rows, -response_len:]
        outs.append(token_logprobs(out.logits[:, :-1], labels, temperature)[0])
    return torch.cat(outs)


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


class RLTrainer:
    """GRPO / DAPO (and Dr.GRPO, RLOO, REINFORCE++) on one process, CPU or one device."""

    def __init__(self, spec: RunSpec, *, device: str = "cpu", tracker: Tracker | None = None):
        if spec.algorithm not in ("grpo", "dapo"):
            raise InputError(f"algorithm: {spec.algorithm} is not trained by this trainer yet; "
                             "use grpo or dapo")
        self.spec, self.device = spec, device
        self.output_dir = Path(spec.trainer.output_dir)
        seed_everything(spec.seed, spec.trainer.deterministic)
        resume_from = self._resume_checkpoint()
        model_path = str(resume_from) if resume_from else spec.model.path
        self.model, self.tokenizer = load_model_and_tokenizer(
            model_path, dtype=spec.model.dtype, tokenizer_path=spec.model.tokenizer_path,
            trust_remote_code=spec.model.trust_remote_code, device=device,
            gradient_checkpointing=spec.model.gradient_checkpointing)
        self.reference = self._make_reference(resume_from) if self._needs_reference() else None
        train_records, val_records = load_prompt_data(spec, cache_dir=self.output_dir / "data")
        self.train = tokenize_prompts(train_records, spec, self.tokenizer, "training")
        self.val = tokenize_prompts(val_records, spec, self.tokenizer, "validation") if val_records else None
        self.loader = ResumableLoader(
            list(range(len(self.train))), spec.data.train_batch_size,
            epochs=None if spec.trainer.total_steps else spec.trainer.total_epochs,
            shuffle=spec.data.shuffle, seed=spec.seed)
        self.total_steps = spec.trainer.total_steps or self.loader.total_steps
        self.rollout = NativeRolloutEngine(self.model, eos_token_ids=eos_ids(self.tokenizer, self.model),
                                           pad_token_id=self.tokenizer.pad_token_id, device=device)
        self.sampling = SamplingParams.from_config(spec.rollout)
        self.engine = TrainEngine.from_spec(self.model, spec.actor, self.total_steps,
                                            spec.model.dtype, device)
        self.rewards = RewardComposer.from_config(spec.reward)
        adv = spec.advantage
        self.kl_ctrl = algos.make_kl_controller(adv.kl_ctrl, adv.kl_coef, adv.kl_target, adv.kl_horizon)
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.step = 0
        if resume_from:
            self._restore(resume_from)
        self.tracker = tracker or make_tracker(spec, self.output_dir)

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
        self.engine.load_state_dict(state["engine"])
        self.loader.load_state_dict(state["loader"])
        set_rng_state(state["rng"])
        self.generator.set_state(state["generator"])
        self.kl_ctrl.value = state["kl_coef"]
        self.step = state["step"]
        log.info("resumed from %s at step %d", checkpoint, self.step)

    def _state(self) -> dict[str, Any]:
        return {"engine": self.engine.state_dict(), "loader": self.loader.state_dict(),
                "rng": rng_state(), "generator": self.generator.get_state(),
                "kl_coef": self.kl_ctrl.value}

    def save(self) -> Path:
        path = save_checkpoint(self.output_dir, self.step, model=self.model,
                               tokenizer=self.tokenizer, state=self._state(),
                               spec_yaml=self.spec.to_yaml())
        log.info("saved %s", path)
        return path

    # ----------------------------------------------------------------------- reference model

    def _needs_reference(self) -> bool:
        s = self.spec
        return s.reference.enable and (s.actor.use_kl_loss or s.advantage.use_kl_in_reward)

    def _make_reference(self, resume_from: Path | None):
        """The initial policy, frozen: a copy now, or the original weights when resuming."""
        if resume_from is None:
            model = copy.deepcopy(self.model)
        else:
            model, _ = load_model_and_tokenizer(self.spec.model.path, dtype=self.spec.model.dtype,
                                                device=self.device)
        model.eval().requires_grad_(False)
        return model

    # ----------------------------------------------------------------------- the loop

    def fit(self) -> dict[str, float]:
        """Train until `total_steps`; returns the last logged metrics."""
        self.tracker.log_params(self.spec.flat_params())
        last: dict[str, float] = {}
        status = "FAILED"
        # A progress bar only when a person watches; logs and the platform get metric lines.
        progress = tqdm(total=self.total_steps, initial=self.step, desc=self.spec.algorithm,
                        unit="step", disable=not sys.stderr.isatty(), leave=True)
        try:
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
            self.rewards.close()
            self.tracker.finish(status)

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
                batch, scores, metrics = self.generate_batch(timer)
            data = self.prepare_update(batch, scores, timer, metrics)
            with timer("update"):
                self.rollout.free_cache()
                metrics.update(self.update(data))
        metrics.update(timer.metrics())
        tokens = int(batch.response_mask.sum() + batch.prompt_mask.sum())
        metrics["perf/tokens_per_s"] = tokens / max(timer.seconds["step"], 1e-9)
        metrics["perf/total_tokens"] = float(tokens)
        return metrics

    # ----------------------------------------------------------------------- rollout + rewards

    def _next_prompts(self) -> Prompts:
        return self.train.take(next(self.loader))

    def _generate(self, prompts: Prompts, params: SamplingParams) -> RolloutBatch:
        self.model.eval()
        return self.rollout.generate(prompts.ids, params, generator=self.generator)

    def _score(self, batch: RolloutBatch, truths: list[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        texts = decode_responses(self.tokenizer, batch)
        row_truths = [truths[i] for i in batch.prompt_index.tolist()]
        scored = self.rewards.score_batch(texts, row_truths)
        scores = torch.tensor(scored.total, dtype=torch.float32)
        metrics = scored.metrics(prefix="reward")
        if not torch.isfinite(scores).all():
            raise TrainingStopped(self.step + 1, "a reward is not finite", metrics)
        buffer = self.spec.advantage.overlong_buffer
        if buffer.enable:
            penalty = algos.overlong_penalty(batch.response_lengths, self.sampling.max_new_tokens,
                                             buffer.len, buffer.penalty_factor)
            scores = scores + penalty
            metrics["reward/overlong_penalty"] = float(penalty.mean())
        return scores, metrics

    def generate_batch(self, timer: Timer) -> tuple[RolloutBatch, torch.Tensor, dict[str, float]]:
        """One batch of scored responses; with DAPO dynamic sampling, only informative groups."""
        dynamic = self.spec.advantage.dynamic_sampling
        if not dynamic.enable:
            prompts = self._next_prompts()
            batch = self._generate(prompts, self.sampling)
            with timer("reward"):
                scores, metrics = self._score(batch, prompts.truths)
            metrics.update(self._batch_metrics(batch, scores))
            return batch, scores, metrics
        return self._dynamic_batch(dynamic.max_num_gen_batches, timer)

    def _dynamic_batch(self, max_batches: int, timer: Timer):
        wanted, n = self.spec.data.train_batch_size, self.sampling.n
        kept: list[tuple[RolloutBatch, torch.Tensor]] = []
        all_scores, metrics, groups, rounds = [], {}, 0, 0
        while groups < wanted and (max_batches == 0 or rounds < max_batches):
            rounds += 1
            prompts = self._next_prompts()
            batch = self._generate(prompts, self.sampling)
            with timer("reward"):
                scores, metrics = self._score(batch, prompts.truths)
            all_scores.append(scores)
            keep, count = algos.filter_groups(scores, batch.prompt_index)
            if count:
                kept.append((select_rows(batch, keep), scores[keep]))
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
        metrics.update(self._batch_metrics(batch, scores))
        return batch, scores, metrics

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

    def _on_policy(self, rows: int) -> bool:
        """One pass over one mini-batch: the old policy is the current one, ratio == 1."""
        return self.spec.actor.ppo_epochs == 1 and self._mini_rows() >= rows

    def _mini_rows(self) -> int:
        return self.spec.actor.ppo_mini_batch_size * self.sampling.n

    def prepare_update(self, batch: RolloutBatch, scores: torch.Tensor, timer: Timer,
                       metrics: dict[str, float]) -> dict[str, torch.Tensor]:
        input_ids, attention_mask, position_ids = batch.to_sequences()
        mask = batch.response_mask.float()
        data = {"input_ids": input_ids, "attention_mask": attention_mask,
                "position_ids": position_ids, "response_mask": mask}
        response_len = batch.response_ids.shape[1]
        micro = self.spec.rollout.log_prob_micro_batch_size
        temperature = self._temperature()
        if not self._on_policy(len(batch)):
            with timer("old_logprob"):
                data["old_logprobs"] = self.engine.forward_logprobs(
                    input_ids, attention_mask, position_ids, response_len,
                    temperature=temperature, micro_batch_size=micro)[0]
        if self.reference is not None:
            with timer("ref"):
                data["ref_logprobs"] = sequence_logprobs(
                    self.reference, input_ids, attention_mask, position_ids, response_len,
                    temperature=temperature, micro_batch_size=self.spec.reference.log_prob_micro_batch_size)
        rewards = token_level_rewards(scores, mask)
        adv = self.spec.advantage
        if adv.use_kl_in_reward:
            old = data.get("old_logprobs", batch.logprobs)
            rewards, current_kl = algos.apply_kl_penalty(rewards, old, data["ref_logprobs"], mask,
                                                         self.kl_ctrl.value, adv.kl_penalty)
            self.kl_ctrl.update(float(current_kl), n_steps=len(batch))
            metrics.update({"actor/reward_kl": float(current_kl), "actor/kl_coef": self.kl_ctrl.value})
        with timer("adv"):
            advantages, _ = algos.compute_advantage(
                adv.adv_estimator, rewards, mask, index=batch.prompt_index,
                **self._advantage_options())
        data["advantages"] = advantages
        metrics["critic/advantages/mean"] = float(algos.masked_mean(advantages, mask))
        return data

    def _temperature(self) -> float:
        return self.sampling.temperature if self.sampling.do_sample else 1.0

    def _advantage_options(self) -> dict[str, Any]:
        adv = self.spec.advantage
        name = adv.adv_estimator
        if name == "grpo":
            return {"norm_adv_by_std": adv.norm_adv_by_std_in_grpo}
        if name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
            return {"gamma": adv.gamma}
        return {}

    def update(self, data: dict[str, torch.Tensor]) -> dict[str, float]:
        self.model.train()
        rows = data["input_ids"].shape[0]
        loss_fn = self._loss_fn()
        sums: dict[str, float] = defaultdict(float)
        count = 0
        for _ in range(self.spec.actor.ppo_epochs):
            order = torch.randperm(rows, generator=self.generator)
            for start in range(0, rows, self._mini_rows()):
                index = order[start:start + self._mini_rows()]
                mini = {k: v[index] for k, v in data.items()}
                try:
                    step_metrics = self.engine.train_step(
                        mini, loss_fn, micro_batch_size=self.spec.actor.ppo_micro_batch_size,
                        loss_agg_mode=self.spec.actor.loss_agg_mode,
                        temperature=self._temperature(), with_entropy=True)
                except NonFiniteError as exc:
                    raise TrainingStopped(self.step + 1, str(exc), exc.metrics) from exc
                for key, value in step_metrics.items():
                    sums[key] += value
                count += 1
        return {k: v / count for k, v in sums.items()}

    def _loss_fn(self) -> Callable:
        actor, name = self.spec.actor, self.spec.actor.policy_loss
        policy_loss = algos.get_policy_loss(name)
        clip = {"clip_ratio_low": actor.clip_ratio_low, "clip_ratio_high": actor.clip_ratio_high}
        if name == "vanilla":
            clip["clip_ratio_c"] = actor.clip_ratio_c
        mode = actor.loss_agg_mode
        norm_len = self.sampling.max_new_tokens

        def loss_fn(mb: dict[str, torch.Tensor], logprobs: torch.Tensor, entropy: torch.Tensor | None):
            mask = mb["response_mask"]
            old = mb["old_logprobs"] if "old_logprobs" in mb else logprobs.detach()
            pg_loss, m = policy_loss(old, logprobs, mb["advantages"], mask, loss_agg_mode=mode,
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
                                   loss_agg_mode=mode)
                loss = loss + actor.kl_loss_coef * kl
                metrics["actor/kl_loss"] = kl.detach()
            return loss, metrics

        return loss_fn

    # ----------------------------------------------------------------------- validation

    def validate(self) -> dict[str, float]:
        """Greedy accuracy and mean reward on the validation prompts."""
        from rl_core.evaluation import evaluate_prompts

        return evaluate_prompts(self, self.val, prefix="val")


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
