"""The DPO recipe: direct preference optimisation against the frozen reference, on the same
roles and controller as RL.

    trainer = DPOTrainer(spec)                 # spec.algorithm == "dpo"
    summary = trainer.fit()

Preference pairs come from one of two places:
- files (`data.train_files` with `data.chosen_key` and `data.rejected_key`): each record a
  prompt, a preferred and a rejected response;
- the model's own answers (synthetic data, or prompt files with answers): every step samples
  `rollout.n_samples_per_prompt` responses to each prompt, scores them with the reward functions
  and pairs the best (chosen) with the worst (rejected) of each prompt whose scores differ:
  chosen = correct, rejected = wrong. Prompts whose answers all score alike give no pair.

A step puts the pairs' sequences (chosen and rejected rows interleaved) into the data channel,
the reference computes their log-probs, and the actor takes one optimizer step per mini-batch of
`actor.ppo_mini_batch_size` pairs, each split over the data-parallel ranks with pairs kept whole.
The loss is `rl_core.algos.dpo_loss` on summed response log-probs (`dpo.beta`, `dpo.loss_type`,
`dpo.label_smoothing`, `dpo.sft_loss_coef`), averaged over the mini-batch's pairs. Metrics:
`dpo/loss`, `dpo/rewards/chosen`, `dpo/rewards/rejected`, `dpo/rewards/margins`,
`dpo/rewards/accuracies` (the preference accuracy), `dpo/pairs`, and validation accuracy as RL.
"""

from __future__ import annotations

import logging

import torch

from rl_core import algos
from rl_core.controller import Controller, batch_metrics
from rl_core.data.batch import Batch
from rl_core.data.prompts import Pairs, Prompts, response_batch, tokenize_pairs
from rl_core.data.run_data import load_pair_data
from rl_core.errors import InputError
from rl_core.recipes.warm import with_model_folders
from rl_core.spec import RunSpec
from rl_core.tracking import Timer, Tracker

log = logging.getLogger("rl_core")


def uses_pair_files(spec: RunSpec) -> bool:
    return bool(spec.data.train_files and spec.data.chosen_key and spec.data.rejected_key)


def pick_pairs(scores: torch.Tensor, prompt_index: torch.Tensor) -> list[tuple[int, int]]:
    """(chosen row, rejected row) per prompt whose responses' scores differ: the first
    best-scored and the first worst-scored row of the group."""
    pairs = []
    for prompt in prompt_index.unique(sorted=True).tolist():
        rows = (prompt_index == prompt).nonzero().squeeze(1)
        group = scores[rows]
        if group.max() > group.min():
            pairs.append((int(rows[group.argmax()]), int(rows[group.argmin()])))
    return pairs


def dpo_loss_fn(config, pair_weight_key: str = "pair_weight"):
    """A `TrainEngine` loss (mode `sum`) over interleaved rows (chosen, rejected, ...): the DPO
    loss of each pair times its weight (1 / pairs in the whole mini-batch)."""

    def loss_fn(mb: dict[str, torch.Tensor], logprobs: torch.Tensor, _entropy):
        mask = mb["response_mask"]
        policy = (logprobs * mask).sum(-1)
        reference = (mb["ref_logprobs"] * mask).sum(-1)
        losses, metrics = algos.dpo_loss(
            policy[0::2], policy[1::2], reference[0::2], reference[1::2], beta=config.beta,
            loss_type=config.loss_type, label_smoothing=config.label_smoothing,
            sft_loss_coef=config.sft_loss_coef, chosen_lengths=mask[0::2].sum(-1))
        loss = (losses * mb[pair_weight_key][0::2]).sum()
        out = {f"dpo/{k}": v for k, v in metrics.items()}
        out["dpo/loss"] = losses.detach().mean()
        return loss, out

    return loss_fn


def mini_batches(pairs: int, size: int, ranks: int) -> list[tuple[int, int]]:
    """[start, stop) of each mini-batch of `size` pairs; a last one with fewer pairs than
    `ranks` (some rank would get none) joins the one before."""
    starts = list(range(0, pairs, size))
    if len(starts) > 1 and pairs - starts[-1] < ranks:
        starts.pop()
    return list(zip(starts, [*starts[1:], pairs]))


class DPOTrainer:
    """DPO on pairs from files or from the policy's own scored samples."""

    def __init__(self, spec: RunSpec, *, device: str | None = None, tracker: Tracker | None = None,
                 backend: str = "local"):
        if spec.algorithm != "dpo":
            raise InputError(f"algorithm: {spec.algorithm} is not trained by the DPO recipe; "
                             "use dpo (grpo, dapo, ppo: rl_core.recipes.rl)")
        spec = with_model_folders(spec)  # tiny:small-addition, models:/x/3: local folders
        self.ctl = Controller(spec, backend=backend, device=device)
        self.spec = spec = self.ctl.spec  # with rollout.engine auto made concrete
        self.tokenizer = self.ctl.tokenizer
        self.pairs: Pairs | None = None
        self.prompts: Prompts | None = None
        self.val: Prompts | None = None
        if uses_pair_files(spec):
            records, _ = load_pair_data(spec)
            if not records:
                raise InputError("data.train_files: no preference pairs in the files")
            self.pairs = tokenize_pairs(records, spec, self.tokenizer)
        else:
            self.prompts, self.val = self.ctl.load_prompts()
        self.ctl.start(len(self.pairs or self.prompts), reference=True, tracker=tracker)
        self.sampling = self.ctl.sampling

    roles = property(lambda self: self.ctl.roles)
    tracker = property(lambda self: self.ctl.tracker)
    output_dir = property(lambda self: self.ctl.output_dir)
    model = property(lambda self: self.ctl.model)

    @property
    def step(self) -> int:
        return self.ctl.step

    def fit(self) -> dict[str, float]:
        """Train until `total_steps`; returns the last logged metrics."""
        validate = (lambda: self.ctl.validate(self.val)) if self.val is not None else None
        return self.ctl.fit(self.train_step, validate)

    def save(self):
        return self.ctl.save()

    def close(self) -> None:
        self.ctl.close()

    # ----------------------------------------------------------------------- a step

    def train_step(self) -> dict[str, float]:
        timer = Timer()
        with timer("step"):
            with timer("rollout"):
                pairs, metrics = self._next_pairs(timer)
            if len(pairs) < self.ctl.dp:  # every data-parallel rank needs a pair
                metrics.update({"dpo/pairs": float(len(pairs)), **timer.metrics()})
                log.warning("step %d: %d preference pairs for %d ranks, no update (a pair needs "
                            "two answers to a prompt that score differently)", self.step + 1,
                            len(pairs), self.ctl.dp)
                return metrics
            batch = self._pair_batch(pairs)
            columns, stage_metrics = self.ctl.run_stages(batch, None, ["ref_logprob"], timer)
            metrics.update(stage_metrics)
            with timer("update"):
                metrics.update(self._update(batch, columns["ref_logprobs"].float()))
        metrics["dpo/pairs"] = float(len(pairs))
        metrics.update(timer.metrics())
        tokens = int(batch.response_mask.sum() + batch.prompt_mask.sum())
        metrics["perf/tokens_per_s"] = tokens / max(timer.seconds["step"], 1e-9)
        return metrics

    def _next_pairs(self, timer: Timer) -> tuple[Pairs, dict[str, float]]:
        rows = next(self.ctl.loader)
        if self.pairs is not None:
            return self.pairs.take(rows), {}
        prompts = self.prompts.take(rows)
        batch = self.ctl.generate(prompts.ids, self.sampling)
        columns, metrics = self.ctl.run_stages(batch, prompts.truths, self.ctl.reward_stages,
                                               timer)
        scores, more = self.ctl.scores(batch, columns, self.sampling.max_new_tokens)
        metrics.update(more)
        metrics.update(batch_metrics(batch, scores))
        chosen_rejected = pick_pairs(scores, batch.prompt_index)
        responses = [batch.response_ids[i, :n].tolist()
                     for i, n in enumerate(batch.response_lengths.tolist())]
        index = batch.prompt_index.tolist()
        return Pairs([prompts.ids[index[c]] for c, _ in chosen_rejected],
                     [responses[c] for c, _ in chosen_rejected],
                     [responses[r] for _, r in chosen_rejected]), metrics

    def _pair_batch(self, pairs: Pairs) -> Batch:
        prompts = [p for p in pairs.prompts for _ in range(2)]
        responses = [r for c, r_ in zip(pairs.chosen, pairs.rejected) for r in (c, r_)]
        responses = [r if r else [self.tokenizer.pad_token_id] for r in responses]
        return response_batch(prompts, responses, self.tokenizer.pad_token_id)

    def _update(self, batch: Batch, ref_logprobs: torch.Tensor) -> dict[str, float]:
        """`ppo_epochs` passes of mini-batches of `ppo_mini_batch_size` pairs, each split over
        the ranks with pairs kept whole; one optimizer step per mini-batch."""
        data = batch.with_sequences()
        data["response_mask"] = batch.response_mask.float()
        data["ref_logprobs"] = ref_logprobs
        n_pairs = len(batch) // 2
        order = torch.randperm(n_pairs, generator=self.ctl.generator)
        per_mini = self.spec.actor.ppo_mini_batch_size
        options = {"micro_batch_size": max(2, self.spec.actor.ppo_micro_batch_size // 2 * 2),
                   "loss_agg_mode": "sum"}
        loss_fn = dpo_loss_fn(self.spec.dpo)
        sums: dict[str, float] = {}
        count = 0
        for _ in range(self.spec.actor.ppo_epochs):
            for start, stop in mini_batches(n_pairs, per_mini, self.ctl.dp):
                pair_rows = order[start:stop]
                mini = data.take(torch.stack([pair_rows * 2, pair_rows * 2 + 1], 1).reshape(-1))
                mini["pair_weight"] = torch.full((len(mini),), 1.0 / len(pair_rows))
                results = self.roles.actor.map("train_step", self.ctl.per_rank([
                    (shard.to_dict(), loss_fn, options, self.step + 1)
                    for shard in mini.split(self.ctl.dp, group=2)]))
                for key, value in results[0].items():
                    sums[key] = sums.get(key, 0.0) + value
                count += 1
        return {k: v / count for k, v in sums.items()}

