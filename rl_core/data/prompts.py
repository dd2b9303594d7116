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

from rl_core.data.batch import Batch, PromptIds, image_columns_of, left_pad
from rl_core.data.datasets import DataError
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


def tokenize_prompts(records, spec: Any, tokenizer, where: str,
                     image_processor: Any = None) -> Prompts:
    """The records' prompts rendered with `data.prompt_template`; longer than
    `data.max_prompt_length` tokens are skipped (with a warning), none left is an InputError.
    Records with images (a vision-language model's data: `image_processor` is its image
    processor) become `PromptIds` carrying them (`tokenize_image_prompts`)."""
    if any(record.images for record in records):
        return tokenize_image_prompts(records, spec, tokenizer, where, image_processor)
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


def tokenize_image_prompts(records, spec: Any, tokenizer, where: str,
                           image_processor: Any) -> Prompts:
    """Prompts with images: every record's images read and checked first (one DataError naming
    each broken one, `rl_core.data.images.load_images`), then each prompt rendered by the chat
    template with its images where `with_image_parts` puts them and expanded to one image token
    per merged patch (`rl_core.models.vision.ImagePrompter`). `data.max_prompt_length` counts
    the image tokens."""
    from rl_core.data.images import load_images
    from rl_core.models.vision import ImagePrompter

    if image_processor is None:
        raise InputError("model.path: the data has images (data.image_key) and the model is not "
                         "a vision-language model; point model.path at one (e.g. Qwen2.5-VL)")
    if spec.data.prompt_template != "chat":
        raise InputError(f"data.prompt_template: {spec.data.prompt_template}: prompts with "
                         "images take the chat template, which places them; set it to chat")
    pictures = load_images(records, where)
    prompter = ImagePrompter(tokenizer, image_processor)
    ids, truths, skipped = [], [], 0
    for record, images in zip(records, pictures):
        messages = with_image_parts(record.prompt, len(images), record.where)
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = prompter(text, images)
        if len(prompt.ids) > spec.data.max_prompt_length:
            skipped += 1
            continue
        ids.append(PromptIds(prompt.ids, prompt) if images else prompt.ids)
        truths.append(record.ground_truth)
    if skipped:
        log.warning("%s: skipped %d prompts longer than data.max_prompt_length=%d tokens "
                    "(image tokens included)", where, skipped, spec.data.max_prompt_length)
    if not ids:
        raise InputError(f"data: no {where} prompt fits data.max_prompt_length="
                         f"{spec.data.max_prompt_length} with its image tokens: raise it")
    return Prompts(ids, truths)


def with_image_parts(prompt: Any, images: int, where: str = "") -> list[dict[str, Any]]:
    """Chat messages placing `images` images: a text prompt becomes one user message with the
    images before the text; in messages, `<image>` in a text content marks where each goes (the
    convention of verl's and LLaMA-Factory's datasets), content parts of type "image" are taken
    as they are, and without either the images go before the first user message's text. A
    count of marks other than `images` is a DataError naming the record."""
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    marks = sum(m["content"].count("<image>") if isinstance(m["content"], str)
                else sum(1 for part in m["content"] if part.get("type") == "image")
                for m in prompt)
    if marks == 0:
        first = next((i for i, m in enumerate(prompt) if m["role"] == "user"), 0)
        content = prompt[first]["content"]
        text = [{"type": "text", "text": content}] if isinstance(content, str) else content
        parts = [{"type": "image"}] * images + text
        return [*prompt[:first], {**prompt[first], "content": parts}, *prompt[first + 1:]]
    if marks != images:
        raise DataError(f"{where}: the prompt marks {marks} image(s) and the record has {images}")
    out = []
    for message in prompt:
        content = message["content"]
        if isinstance(content, str):
            pieces = content.split("<image>")
            content = [{"type": "text", "text": pieces[0]}] + [
                part for piece in pieces[1:]
                for part in ({"type": "image"}, {"type": "text", "text": piece})]
            content = [part for part in content if part["type"] == "image" or part["text"]]
        out.append({**message, "content": content})
    return out


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
    """Prompts (left-padded) followed by known responses (right-padded), as a rollout would be
    (with the image columns of prompts carrying images)."""
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
                  "finished": torch.ones(len(prompts), dtype=torch.bool),
                  **(image_columns_of(prompts) or {})})


def decode_responses(tokenizer, batch: Batch) -> list[str]:
    """Each row's response text (its first `response_lengths` tokens, special tokens dropped)."""
    return decode_rows(tokenizer, batch["response_ids"], batch["response_lengths"])


def decode_rows(tokenizer, response_ids: torch.Tensor, lengths: torch.Tensor) -> list[str]:
    rows = [response_ids[i, :n].tolist() for i, n in enumerate(lengths.tolist())]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
