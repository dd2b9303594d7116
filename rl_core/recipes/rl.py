"""The RL recipe: GRPO, DAPO, PPO (and Dr.GRPO, RLOO, REINFORCE++, GSPO).

    trainer = RLTrainer(spec)                  # roles in this process
    trainer = RLTrainer(spec, backend="ray")   # roles as Ray actors on the spec's devices
    summary = trainer.fit()                    # rollout -> stages -> advantages -> updates

One step: the actor's ranks sample `n_samples_per_prompt` responses for their share of
`data.train_batch_size` prompts (the draws of each row come from one table seeded per step, so
the shards equal one whole batch); the batch goes into the data channel, and the stages that
work row by row pull it from there at once: `reward` (reward workers), `ref_logprob`
(reference, when a KL term is on), `old_logprob` (the actor, skipped when the update is
strictly on-policy) and `values` (the critic, PPO). The recipe computes advantages, then the
actor (and the critic) update on `ppo_epochs` passes of mini-batches, each split over the
data-parallel ranks. DAPO adds overlong reward shaping and dynamic sampling (rewards first, then
the other stages on the kept groups). With partial rollout (`rollout.partial_rollout_max_split`)
a step's rollout is calls of a piece of each response until `data.train_batch_size` groups are
complete (`Controller.generate_partial`); the unfinished responses wait in a buffer saved with the
checkpoint and go on in the next step under the updated policy. With a rollout pool of its own
and `trainer.max_staleness` k > 0 the pool generates the next k batches while the actor trains
(`rl_core.rollout.ahead`); the update recomputes the old log-probs and corrects by
`actor.rollout_is`.

With the same seed the two backends give the same metrics, up to floating-point rounding, for
any number of data-parallel ranks. The data, roles, checkpoints and loop are the controller's
(`rl_core.controller`); this file is the algorithm.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import torch

from rl_core import algos
from rl_core.controller import Controller, batch_metrics, token_balanced
from rl_core.data.batch import IMAGE_COLUMNS, Batch
from rl_core.data.partial import PartialRollouts
from rl_core.errors import InputError, TrainingStopped
from rl_core.precision import update_data
from rl_core.recipes.warm import with_model_folders
from rl_core.rollout.ahead import RolloutsAhead
from rl_core.rollout.turns import loss_mask, turn_parts
from rl_core.roles.group import collect
from rl_core.spec import RunSpec
from rl_core.tracking import Timer, Tracker

log = logging.getLogger("rl_core")
DEFAULT_SAMPLE_EVERY = 10  # tools.monitor.sample_every: null
SAMPLE_PICTURE_EDGE = 256  # the longest side of a sample's picture in the sample viewer, pixels

ALGORITHMS = ("grpo", "dapo", "ppo")
ACTOR_KEYS = ("input_ids", "attention_mask", "position_ids", "response_mask",
              "old_logprobs", "ref_logprobs", "advantages", "rollout_is_weights")
CRITIC_KEYS = ("input_ids", "attention_mask", "position_ids", "response_mask", "values", "returns")


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The outcome reward on each response's last token (of the mask, which may have holes:
    a multi-turn response's tool tokens). scores (B,), mask (B, R) -> (B, R)."""
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    columns = torch.arange(response_mask.shape[1])
    last = torch.where(response_mask > 0, columns, 0).amax(1) if response_mask.shape[1] else \
        torch.zeros(len(scores), dtype=torch.long)
    rewards[torch.arange(len(scores)), last] = scores.float()
    return rewards * response_mask


def advantage_options(spec: RunSpec) -> dict[str, Any]:
    """The estimator's own settings from the spec's `advantage` section."""
    adv = spec.advantage
    name = adv.adv_estimator
    if name == "grpo":
        return {"norm_adv_by_std": adv.norm_adv_by_std_in_grpo}
    if name in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        return {"gamma": adv.gamma}
    if name == "gae":
        return {"gamma": adv.gamma, "lam": adv.lam}
    return {}


class RLTrainer:
    """GRPO / DAPO / PPO (and the estimator variants) with roles local or on Ray."""

    def __init__(self, spec: RunSpec, *, device: str | None = None, tracker: Tracker | None = None,
                 backend: str = "local"):
        if spec.algorithm not in ALGORITHMS:
            raise InputError(f"algorithm: {spec.algorithm} is not trained by the RL recipe; "
                             "use grpo, dapo or ppo (dpo: rl_core.recipes.dpo)")
        spec = with_model_folders(spec)  # tiny:small-addition, models:/x/3: local folders
        self.ctl = Controller(spec, backend=backend, device=device)
        self.spec = spec = self.ctl.spec  # with rollout.engine auto made concrete
        self.tokenizer = self.ctl.tokenizer
        self.train, self.val = self.ctl.load_prompts()
        adv = spec.advantage
        self.kl_ctrl = algos.make_kl_controller(adv.kl_ctrl, adv.kl_coef, adv.kl_target, adv.kl_horizon)
        reference = spec.reference.enable and (spec.actor.use_kl_loss or adv.use_kl_in_reward)
        self.reference = reference  # the ref_logprob stage (actor.lora: the actor's own)
        restored = self.ctl.start(len(self.train), reference=reference, tracker=tracker)
        self.partial = PartialRollouts.from_spec(spec, self.ctl.turns)
        staleness = spec.trainer.max_staleness
        self.ahead = RolloutsAhead(self.ctl, self.train, staleness) if staleness else None
        if staleness and spec.actor.rollout_is == "off":
            log.warning("trainer.max_staleness %d with actor.rollout_is off: the update does not "
                        "correct for the older policy that generated a batch", staleness)
        if restored is not None:
            self.kl_ctrl.value = restored["kl_coef"]
            try:
                self._restore_partial(restored.get("partial"))
                self._restore_ahead(restored.get("ahead"))
            except InputError:
                self.ctl.stop("FAILED")
                raise
        self.sampling = self.ctl.sampling

    # the run's state, for callers and tests
    roles = property(lambda self: self.ctl.roles)
    tracker = property(lambda self: self.ctl.tracker)
    output_dir = property(lambda self: self.ctl.output_dir)
    model = property(lambda self: self.ctl.model)
    total_steps = property(lambda self: self.ctl.total_steps)

    @property
    def step(self) -> int:
        return self.ctl.step

    @step.setter
    def step(self, value: int) -> None:
        self.ctl.step = value

    def fit(self) -> dict[str, float]:
        """Train until `total_steps`; returns the last logged metrics."""
        validate = (lambda: self.ctl.validate(self.val)) if self.val is not None else None
        return self.ctl.fit(self.train_step, validate, self._state)

    def save(self):
        return self.ctl.save(self._state())

    def close(self) -> None:
        self.ctl.close()

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"kl_coef": self.kl_ctrl.value}
        if self.partial is not None:
            state["partial"] = self.partial.state_dict()
        if self.ahead is not None:  # the batches generated ahead: trained first on resume
            state["ahead"] = self.ahead.state_dict()
        return state

    def _restore_ahead(self, state: dict[str, Any] | None) -> None:
        """The checkpoint's batches generated ahead back in line (resumed without rollouts
        ahead, they still train first: generated again if too old, none lost); with dynamic
        sampling or partial rollout now on they are dropped, with a warning."""
        if state is None or not state["batches"]:
            return
        if self.ahead is None:
            if self.spec.advantage.dynamic_sampling.enable or self.partial is not None:
                log.warning("the checkpoint's %d batches generated ahead are dropped: dynamic "
                            "sampling or partial rollout is on", len(state["batches"]))
                return
            self.ahead = RolloutsAhead(self.ctl, self.train, 0)
        self.ahead.load_state_dict(state)

    def _restore_partial(self, state: dict[str, Any] | None) -> None:
        """The checkpoint's waiting responses back into the buffer (a checkpoint without them
        starts it empty; with partial rollout now off they are dropped, with a warning)."""
        if self.partial is not None and state is not None:
            self.partial.load_state_dict(state)
        elif state is not None and state["groups"]:
            log.warning("rollout.partial_rollout_max_split is off: the checkpoint's %d groups "
                        "in flight are dropped", len(state["groups"]))

    # ----------------------------------------------------------------------- a step

    def train_step(self) -> dict[str, float]:
        timer = Timer()
        with timer("step"):
            with timer("rollout"):
                batch, metrics, columns = self.generate_batch(timer)
            self.log_samples(batch, columns)
            self.dump_stages(batch, columns)
            data = self.prepare_update(batch, columns, timer, metrics)
            self.ctl.dump_data("advantages", {k: data[k] for k in ("advantages", "returns",
                                                                   "token_rewards") if k in data})
            with timer("update"):
                metrics.update(self.update(data))
            self.ctl.dump_data("update", update_data(metrics))
        metrics.update(timer.metrics())
        tokens = int(batch.response_mask.sum() + batch.prompt_mask.sum())
        metrics["perf/tokens_per_s"] = tokens / max(timer.seconds["step"], 1e-9)
        metrics["perf/total_tokens"] = float(tokens)
        return metrics

    def log_samples(self, batch: Batch, columns: Batch) -> None:
        """Every `tools.monitor.sample_every` steps (and at the first): the first response to
        each of the step's first `num_samples` prompts, with its reward, as the table artifact
        `samples/step_<N>.json` (the run page's sample viewer reads it)."""
        monitor, step = self.spec.tools.monitor, self.step + 1
        every = DEFAULT_SAMPLE_EVERY if monitor.sample_every is None else monitor.sample_every
        if not every or (step != 1 and step % every):
            return
        index = batch.prompt_index.tolist()
        rows = [i for i in range(len(index)) if i == 0 or index[i] != index[i - 1]]
        rows = rows[:monitor.num_samples]
        decode = lambda ids, mask: self.tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)  # noqa: E731
        table: dict[str, list] = {
            "prompt": [decode(batch.prompt_ids[i], batch.prompt_mask[i]) for i in rows],
            "response": [decode(batch.response_ids[i], batch.response_mask[i]) for i in rows],
            "reward": [round(float(columns["score"][i]), 6) for i in rows],
            "response_tokens": [int(batch.response_mask[i].sum()) for i in rows],
        }
        for name in self.ctl.rewards.names:  # each reward function's own score, where kept
            if f"reward_fn/{name}" in columns:
                table[f"reward/{name}"] = [round(float(columns[f"reward_fn/{name}"][i]), 6)
                                           for i in rows]
        if "tool_mask" in batch:  # multi-turn: the model's turns and the tools' answers
            table["turns"] = [turn_parts(self.tokenizer, batch.response_ids[i],
                                         batch.response_mask[i], batch["tool_mask"][i])
                              for i in rows]
            table["tool_calls"] = [int(batch["tool_calls"][i]) for i in rows]
        if "pixel_values" in batch and self.ctl.image_processor is not None:
            table["images"] = self._sample_pictures(batch, rows, step)
        self.ctl.tracker.log_table(table, f"samples/step_{step}.json")

    def _sample_pictures(self, batch: Batch, rows: list[int], step: int) -> list[list[str]]:
        """The pictures of the sampled rows as the model saw them (PNG files
        `samples/step_<N>/<row>_<image>.png`, at most `SAMPLE_PICTURE_EDGE` pixels a side);
        each row's list of their paths, relative to the run's artifacts."""
        from rl_core.data.images import pictures_of

        folder = self.ctl.output_dir / "samples" / f"step_{step}"
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for index, row in enumerate(rows):
            pictures = pictures_of(batch["pixel_values"][row], batch["image_grid_thw"][row],
                                   self.ctl.image_processor)
            names = []
            for number, picture in enumerate(pictures):
                picture.thumbnail((SAMPLE_PICTURE_EDGE, SAMPLE_PICTURE_EDGE))
                picture.save(folder / f"{index}_{number}.png")
                names.append(f"samples/step_{step}/{index}_{number}.png")
            paths.append(names)
        self.ctl.tracker.log_artifacts(folder, f"samples/step_{step}")
        return paths

    def dump_stages(self, batch: Batch, columns: Batch) -> None:
        """The data of the rollout and of the stages after it, in a dumped step
        (`tools.precision`; the update's and the advantages' are dumped where they are made)."""
        dump = self.ctl.dump_data
        dump("rollout", {k: batch[k] for k in ("prompt_ids", "response_ids", "response_lengths",
                                               "logprobs", "prompt_index") if k in batch})
        dump("reward", {k: columns[k] for k in columns.keys()
                        if k == "score" or k.startswith("reward_fn/")})
        for stage, column in (("ref_logprob", "ref_logprobs"), ("old_logprob", "old_logprobs"),
                              ("values", "values")):
            if column in columns:
                dump(stage, {column: columns[column]})

    def generate_batch(self, timer: Timer) -> tuple[Batch, dict[str, float], Batch]:
        """One batch of scored responses (and its stage outputs); with DAPO dynamic sampling,
        only informative groups."""
        dynamic = self.spec.advantage.dynamic_sampling
        if dynamic.enable:
            return self._dynamic_batch(dynamic.max_num_gen_batches, timer)
        if self.partial is not None:
            batch, truths, metrics = self.ctl.generate_partial(
                self.partial, self.train, self.spec.data.train_batch_size)
        elif self.ahead is not None:  # the policy version training it: the updates so far
            batch, truths, metrics = self.ahead.next(self.step)
        else:
            prompts = self.train.take(next(self.ctl.loader))
            batch = self.ctl.generate(prompts.ids, self.sampling)
            truths, metrics = prompts.truths, {}
        columns, more = self.ctl.run_stages(batch, truths, self._stages(), timer)
        metrics.update(more)
        scores, more = self.ctl.scores(batch, columns, self.sampling.max_new_tokens)
        metrics.update(more)
        metrics.update(batch_metrics(batch, scores))
        columns["score"] = scores
        return batch, metrics, columns

    def _dynamic_batch(self, max_batches: int, timer: Timer):
        wanted, n = self.spec.data.train_batch_size, self.sampling.n
        kept: list[Batch] = []
        all_scores, metrics, groups, rounds = [], {}, 0, 0
        while groups < wanted and (max_batches == 0 or rounds < max_batches):
            rounds += 1
            prompts = self.train.take(next(self.ctl.loader))
            batch = self.ctl.generate(prompts.ids, self.sampling)
            columns, metrics = self.ctl.run_stages(batch, prompts.truths,
                                                   self.ctl.reward_stages, timer)
            scores, more = self.ctl.scores(batch, columns, self.sampling.max_new_tokens)
            metrics.update(more)
            all_scores.append(scores)
            keep, count = algos.filter_groups(scores, batch.prompt_index)
            if count:
                batch["score"] = scores
                kept.append(batch.take(keep))
                groups += count
        metrics.update({"dapo/num_gen_batches": float(rounds), "dapo/kept_groups": float(min(groups, wanted))})
        metrics["reward/mean_all"] = float(torch.cat(all_scores).mean())
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
        offset = 0
        for part in kept:  # prompt indices must stay distinct across generation rounds
            index = part.prompt_index
            part["prompt_index"] = index + offset
            offset += int(index.max()) + 1
        batch = Batch.concat(kept).slice(0, wanted * n)
        scores = batch["score"]
        rest = [s for s in self._stages() if s not in self.ctl.reward_stages]
        columns, stage_metrics = self.ctl.run_stages(batch, None, rest, timer)
        metrics.update(stage_metrics)
        columns["score"] = scores
        metrics.update(batch_metrics(batch, scores))
        return batch, metrics, columns

    def _stages(self) -> list[str]:
        stages = list(self.ctl.reward_stages)
        if self.reference:
            stages.append("ref_logprob")
        if not self._on_policy() or self._corrects_rollout():
            stages.append("old_logprob")
        if self.roles.critic is not None:
            stages.append("values")
        return stages

    # ----------------------------------------------------------------------- update

    def _on_policy(self) -> bool:
        """One pass over one mini-batch of a batch the current policy generated: the old
        policy is the current one, ratio == 1."""
        rows = self.spec.data.train_batch_size * self.sampling.n
        return (self.spec.actor.ppo_epochs == 1 and self._mini_rows() >= rows
                and not self.spec.trainer.max_staleness)

    def _corrects_rollout(self) -> bool:
        """Whether the update needs the training engine's old log-probs beside the rollout's:
        another engine generated (its kernels round differently), IS correction is on, or
        partial rollout or rollouts ahead of the update (`trainer.max_staleness`) sampled
        under older policies."""
        return (self.spec.rollout.engine != "native" or self.spec.actor.rollout_is != "off"
                or (self.partial is not None and self.partial.partial)
                or self.ahead is not None)

    def _mini_rows(self) -> int:
        return self.spec.actor.ppo_mini_batch_size * self.sampling.n

    def prepare_update(self, batch: Batch, columns: Batch, timer: Timer,
                       metrics: dict[str, float]) -> Batch:
        """The update's columns: sequences, stage outputs, advantages (and returns)."""
        data = batch.with_sequences()  # attention over every token, the tools' included
        mask = loss_mask(batch.response_mask, batch.get("tool_mask")).float()
        data["response_mask"] = mask  # the loss's tokens: the model's own
        for name in ("old_logprobs", "ref_logprobs", "values"):
            if name in columns:
                data[name] = columns[name].float()
        if self._corrects_rollout():
            weights, more = algos.rollout_is_weights(
                data["old_logprobs"], batch.logprobs.float(), mask, self.spec.actor.rollout_is,
                self.spec.actor.rollout_is_cap)
            metrics.update(more)
            if self.spec.actor.rollout_is != "off":
                data["rollout_is_weights"] = weights
        rewards = token_level_rewards(columns["score"], mask)
        adv = self.spec.advantage
        if adv.use_kl_in_reward:
            old = data.get("old_logprobs", batch.logprobs)
            rewards, current_kl = algos.apply_kl_penalty(rewards, old, data["ref_logprobs"], mask,
                                                         self.kl_ctrl.value, adv.kl_penalty)
            self.kl_ctrl.update(float(current_kl), n_steps=len(batch))
            metrics.update({"actor/reward_kl": float(current_kl), "actor/kl_coef": self.kl_ctrl.value})
        data["token_rewards"] = rewards  # with the in-reward KL penalty, if any
        with timer("adv"):
            advantages, returns = algos.compute_advantage(
                adv.adv_estimator, rewards, mask, index=batch.prompt_index,
                values=data.get("values"), **advantage_options(self.spec))
        data["advantages"] = advantages
        if "values" in data:
            data["returns"] = returns
            metrics["critic/values/mean"] = float(algos.masked_mean(data["values"], mask))
            metrics["critic/returns/mean"] = float(algos.masked_mean(returns, mask))
        metrics["critic/advantages/mean"] = float(algos.masked_mean(advantages, mask))
        return data

    def update(self, data: Batch) -> dict[str, float]:
        """`ppo_epochs` passes of mini-batches; each mini-batch split over the ranks by
        tokens (`token_balanced`). The
        critic (PPO) updates at the same time as the actor, on the same mini-batches."""
        dp = self.ctl.dp
        per_rank: list[list[Batch]] = [[] for _ in range(dp)]
        for _ in range(self.spec.actor.ppo_epochs):
            order = torch.randperm(len(data), generator=self.ctl.generator)
            for start in range(0, len(data), self._mini_rows()):
                mini = data.take(order[start:start + self._mini_rows()])
                for rank, shard in enumerate(token_balanced(mini, dp)[0]):
                    per_rank[rank].append(shard)
        step = self.step + 1
        calls = [self.roles.actor.submit_map("update", self.ctl.per_rank([
            ([m.select([*ACTOR_KEYS, *(c for c in IMAGE_COLUMNS if c in m)]).to_dict()
              for m in minis], step) for minis in per_rank]))]
        if self.roles.critic is not None:
            calls.append(self.roles.critic.submit_map("update", self.ctl.per_rank([
                ([m.select(CRITIC_KEYS).to_dict() for m in minis], step) for minis in per_rank])))
        receiving = self.ctl.pool_receives()  # the update ends by sending the weights there
        if receiving is not None and self.ahead is not None:
            self.ahead.received(receiving)  # behind the batches ahead: collected after them
            receiving = None
        results = collect(*calls, *([receiving] if receiving is not None else []))
        sums: dict[str, float] = defaultdict(float)
        counts: dict[str, int] = defaultdict(int)
        if receiving is not None:
            sums["timing/weight_receive"] = max(r["timing/weight_receive"] for r in results[-1])
            counts["timing/weight_receive"] = 1
        for per_group in results[:len(calls)]:
            for step_metrics in per_group[0]:  # every rank reports the same (all-reduced) values
                for key, value in step_metrics.items():
                    sums[key] += value
                    counts[key] += 1
        return {k: v / counts[k] for k, v in sums.items()}
