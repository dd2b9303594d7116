"""Tokenized training items: prompts with their ground truths, preference pairs, and batches of
known responses laid out as a rollout would produce them.

    prompts = tokenize_prompts(records, spec, tokenizer, "training")
    pairs = tokenize_pairs(pair_records, spec, tokenizer)
    batch = response_batch(prompt_ids, response_ids, pad)          # a `Batch` (ROLLOUT_COLUMNS)
    texts = decode_responses(tokenizer, batch)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from rl_core.data.batch import Batch, left_pad
from rl_core.data.templates import render_prompt, render_prompts
from rl_core.errors import InputError

log = logging.getLogger("rl_core")


@dataclass
class Prompts:
    """Tokenized prompts and their ground truths."""

    ids: list[list[int]]
    truths: list[Any]

    def take(self, rows: list[int]) -> Prompts:
        return Prompts([self.ids[i] for i in rows], [self.truths[i] for i in rows])

    def __len__(self) -> int:
        return len(self.ids)


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


def tokenize_prompts(records, spec: Any, tokenizer, where: str) -> Prompts:
    """The records' prompts rendered with `data.prompt_template`; longer than
    `data.max_prompt_length` tokens are skipped (with a warning), none left is an InputError."""
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


def tokenize_pairs(records, spec: Any, tokenizer) -> Pairs:
    """Preference records (prompt, chosen, rejected) as token ids; each response ends with the
    eos token; pairs whose prompt is longer than `data.max_prompt_length` are left out."""
    template = spec.data.prompt_template
    end = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    out = Pairs([], [], [])
    for record in records:
        if not isinstance(record.chosen, str) or not isinstance(record.rejected, str):
            raise InputError(f"{record.where}: chosen and rejected must be text")
        prompt = tokenizer.encode(render_prompt(record.prompt, template, tokenizer),
                                  add_special_tokens=False)
        if len(prompt) > spec.data.max_prompt_length:
            continue
        out.prompts.append(prompt)
        out.chosen.append(tokenizer.encode(record.chosen, add_special_tokens=False) + end)
        out.rejected.append(tokenizer.encode(record.rejected, add_special_tokens=False) + end)
    if not out.prompts:
        raise InputError("data.max_prompt_length: every preference pair's prompt is longer")
    return out


def response_batch(prompts: list[list[int]], responses: list[list[int]], pad: int) -> Batch:
    """Prompts (left-padded) followed by known responses (right-padded), as a rollout would be."""
    prompt_ids, prompt_mask = left_pad(prompts, pad)
    width = max(len(r) for r in responses)
    response_ids = torch.full((len(responses), width), pad, dtype=torch.long)
    response_mask = torch.zeros((len(responses), width), dtype=torch.long)
    for row, tokens in enumerate(responses):
        response_ids[row, : len(tokens)] = torch.tensor(tokens)
        response_mask[row, : len(tokens)] = 1
    return Batch({"prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
                  "response_ids": response_ids, "response_mask": response_mask,
                  "logprobs": torch.zeros(response_ids.shape),
                  "prompt_index": torch.arange(len(prompts)),
                  "response_lengths": response_mask.sum(1),
                  "finished": torch.ones(len(prompts), dtype=torch.bool)})


def decode_responses(tokenizer, batch: Batch) -> list[str]:
    """Each row's response text (its first `response_lengths` tokens, special tokens dropped)."""
    return decode_rows(tokenizer, batch["response_ids"], batch["response_lengths"])


def decode_rows(tokenizer, response_ids: torch.Tensor, lengths: torch.Tensor) -> list[str]:
    rows = [response_ids[i, :n].tolist() for i, n in enumerate(lengths.tolist())]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
