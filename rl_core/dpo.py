"""DPO: direct preference optimisation against the frozen reference, on the same roles as RL.

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
from dataclasses import dataclass
from typing import Any

import torch

from rl_core import algos
from rl_core.data.run_data import load_pair_data
from rl_core.data.templates import render_prompt
from rl_core.engines.rollout import RolloutBatch
from rl_core.errors import InputError
from rl_core.sft import response_batch
from rl_core.spec import RunSpec
from rl_core.trainer import Prompts, RLTrainer, Timer, shard_bounds

log = logging.getLogger("rl_core")


@dataclass
class Pairs:
    """Tokenized preference pairs: prompt, chosen and rejected token ids."""

    prompts: list[list[int]]
    chosen: list[list[int]]
    rejected: list[list[int]]

    def take(self, rows: list[int]) -> Pairs:
        return Pairs(*([items[i] for i in rows] for items in (self.prompts, self.chosen, self.rejected)))

    def __len__(self) -> int:
        return len(self.prompts)


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


class DPOTrainer(RLTrainer):
    """DPO on pairs from files or from the policy's own scored samples."""

    ALGORITHMS = ("dpo",)

    def _load_data(self) -> tuple[Any, Prompts | None]:
        if not uses_pair_files(self.spec):
            return super()._load_data()
        train, _ = load_pair_data(self.spec)
        if not train:
            raise InputError("data.train_files: no preference pairs in the files")
        return self._tokenize_pairs(train), None

    def _tokenize_pairs(self, records) -> Pairs:
        tok, template = self.tokenizer, self.spec.data.prompt_template
        end = [tok.eos_token_id] if tok.eos_token_id is not None else []
        out = Pairs([], [], [])
        for record in records:
            if not isinstance(record.chosen, str) or not isinstance(record.rejected, str):
                raise InputError(f"{record.where}: chosen and rejected must be text")
            prompt = tok.encode(render_prompt(record.prompt, template, tok), add_special_tokens=False)
            if len(prompt) > self.spec.data.max_prompt_length:
                continue
            out.prompts.append(prompt)
            out.chosen.append(tok.encode(record.chosen, add_special_tokens=False) + end)
            out.rejected.append(tok.encode(record.rejected, add_special_tokens=False) + end)
        if not out.prompts:
            raise InputError("data.max_prompt_length: every preference pair's prompt is longer")
        return out

    def _needs_reference(self) -> bool:
        return True

    def _stages(self) -> list[str]:
        return ["ref_logprob"]

    # ----------------------------------------------------------------------- a step

    def train_step(self) -> dict[str, float]:
        timer = Timer()
        with timer("step"):
            with timer("rollout"):
                pairs, metrics = self._next_pairs(timer)
            if not len(pairs):
                metrics.update({"dpo/pairs": 0.0, **timer.metrics()})
                log.warning("step %d: no preference pair (every group's answers scored alike)",
                            self.step + 1)
                return metrics
            batch = self._pair_batch(pairs)
            columns, stage_metrics = self._run_stages(batch, None, self._stages(), timer)
            metrics.update(stage_metrics)
            with timer("update"):
                metrics.update(self._update_pairs(batch, columns["ref_logprobs"].float()))
        metrics["dpo/pairs"] = float(len(pairs))
        metrics.update(timer.metrics())
        tokens = int(batch.response_mask.sum() + batch.prompt_mask.sum())
        metrics["perf/tokens_per_s"] = tokens / max(timer.seconds["step"], 1e-9)
        return metrics

    def _next_pairs(self, timer: Timer) -> tuple[Pairs, dict[str, float]]:
        rows = next(self.loader)
        if isinstance(self.train, Pairs):
            return self.train.take(rows), {}
        prompts = self.train.take(rows)
        batch = self.generate(prompts.ids, self.sampling)
        columns, metrics = self._run_stages(batch, prompts.truths, ["reward"], timer)
        scores, more = self._shape_scores(batch, columns)
        metrics.update(more)
        metrics.update(self._batch_metrics(batch, scores))
        chosen_rejected = pick_pairs(scores, batch.prompt_index)
        responses = [batch.response_ids[i, :n].tolist()
                     for i, n in enumerate(batch.response_lengths.tolist())]
        index = batch.prompt_index.tolist()
        return Pairs([prompts.ids[index[c]] for c, _ in chosen_rejected],
                     [responses[c] for c, _ in chosen_rejected],
                     [responses[r] for _, r in chosen_rejected]), metrics

    def _pair_batch(self, pairs: Pairs) -> RolloutBatch:
        prompts = [p for p in pairs.prompts for _ in range(2)]
        responses = [r for c, r_ in zip(pairs.chosen, pairs.rejected) for r in (c, r_)]
        responses = [r if r else [self.tokenizer.pad_token_id] for r in responses]
        return response_batch(prompts, responses, self.tokenizer.pad_token_id)

    def _update_pairs(self, batch: RolloutBatch, ref_logprobs: torch.Tensor) -> dict[str, float]:
        input_ids, attention_mask, position_ids = batch.to_sequences()
        data = {"input_ids": input_ids, "attention_mask": attention_mask,
                "position_ids": position_ids, "response_mask": batch.response_mask.float(),
                "ref_logprobs": ref_logprobs}
        n_pairs = len(batch) // 2
        order = torch.randperm(n_pairs, generator=self.generator)
        per_mini = self.spec.actor.ppo_mini_batch_size
        micro = max(2, self.spec.actor.ppo_micro_batch_size // 2 * 2)
        loss_fn = dpo_loss_fn(self.spec.dpo)
        sums: dict[str, float] = {}
        count = 0
        for _ in range(self.spec.actor.ppo_epochs):
            for start in range(0, n_pairs, per_mini):
                pair_rows = order[start:start + per_mini]
                rows = torch.stack([pair_rows * 2, pair_rows * 2 + 1], 1).reshape(-1)
                mini = {k: v[rows] for k, v in data.items()}
                mini["pair_weight"] = torch.full((len(rows),), 1.0 / len(pair_rows))
                shards = [{k: v[2 * a:2 * b] for k, v in mini.items()}
                          for a, b in shard_bounds(len(pair_rows), self.dp)]
                options = {"micro_batch_size": micro, "loss_agg_mode": "sum"}
                results = self.roles.actor.map("train_step", [
                    (shard, loss_fn, options, self.step + 1) for shard in shards])
                for key, value in results[0].items():
                    sums[key] = sums.get(key, 0.0) + value
                count += 1
        return {k: v / count for k, v in sums.items()}
