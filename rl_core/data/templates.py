"""Prompt templates: the tokenizer's chat template (`chat`) or a named text template.

    render_prompt("12+345=", "plain")                 # '12+345='
    render_prompt("What is 2+2?", "chat", tokenizer)  # chat format with the generation prompt
    render_prompts(records, "r1", tokenizer, max_length=128)  # drops prompts over 128 tokens

`TEMPLATES` is the registry of named templates (`data.prompt_template` in the run spec); add one
by adding an entry. A named template is text with a `{prompt}` placeholder; it formats text
prompts, not chat messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rl_core.data.datasets import DataError, Messages, PromptRecord

CHAT = "chat"

TEMPLATES: dict[str, str] = {
    # The prompt as is: synthetic tasks for tiny character-level models.
    "plain": "{prompt}",
    # DeepSeek-R1-Zero's template: reasoning in <think>, the answer in <answer>.
    "r1": (
        "A conversation between User and Assistant. The user asks a question, and the Assistant "
        "solves it. The assistant first thinks about the reasoning process in the mind and then "
        "provides the user with the answer. The reasoning process and answer are enclosed within "
        "<think> </think> and <answer> </answer> tags, respectively, i.e., "
        "<think> reasoning process here </think><answer> answer here </answer>. "
        "User: {prompt}\nAssistant:"
    ),
    # Qwen2.5-Math's instruction: the final answer in \boxed{}.
    "qwen_math": (
        "{prompt}\nPlease reason step by step, and put your final answer within \\boxed{}."
    ),
}


def template_names() -> list[str]:
    """Every valid `data.prompt_template`: `chat` and the registered names."""
    return [CHAT, *sorted(TEMPLATES)]


def check_template(name: str) -> None:
    """Raise DataError listing the valid names when `name` is not a template."""
    if name != CHAT and name not in TEMPLATES:
        raise DataError(
            f"unknown prompt template {name!r}: choose one of {', '.join(template_names())}"
        )


def render_prompt(prompt: str | Messages, template: str, tokenizer: Any = None) -> str:
    """The text given to the model for `prompt`.

    `chat` calls `tokenizer.apply_chat_template` with the generation prompt appended (a text
    prompt becomes one user message); a named template substitutes a text prompt for `{prompt}`.
    """
    check_template(template)
    if template == CHAT:
        return _apply_chat_template(prompt, tokenizer)
    if not isinstance(prompt, str):
        raise DataError(
            f"template {template!r} formats text prompts and this prompt is chat messages: "
            f"use prompt_template {CHAT!r}"
        )
    return TEMPLATES[template].replace("{prompt}", prompt)


def _apply_chat_template(prompt: str | Messages, tokenizer: Any) -> str:
    if tokenizer is None:
        raise DataError(f"prompt template {CHAT!r} needs a tokenizer")
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"the tokenizer has no chat template: choose another prompt template "
            f"({', '.join(sorted(TEMPLATES))})"
        )
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


@dataclass(frozen=True)
class RenderedPrompt:
    """A record with the text the model sees and its length in tokens (None without a tokenizer)."""

    record: PromptRecord
    text: str
    num_tokens: int | None = None


def render_prompts(
    records: Sequence[PromptRecord],
    template: str,
    tokenizer: Any = None,
    *,
    max_length: int | None = None,
) -> tuple[list[RenderedPrompt], int]:
    """Render every record; with `max_length`, prompts longer than it in tokens are skipped
    (`data.max_prompt_length`). Returns the kept prompts and how many were skipped."""
    check_template(template)
    if max_length is not None and tokenizer is None:
        raise DataError("max_length counts tokens: pass the tokenizer")
    kept: list[RenderedPrompt] = []
    for record in records:
        text = render_prompt(record.prompt, template, tokenizer)
        count = None
        if tokenizer is not None:
            # The chat template already wrote any special tokens into the text.
            count = len(tokenizer.encode(text, add_special_tokens=False))
        if max_length is None or count <= max_length:
            kept.append(RenderedPrompt(record, text, count))
    return kept, len(records) - len(kept)
