"""Prompt templates: named text templates, the tokenizer's chat template, length filtering."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rl_core.data import (
    TEMPLATES,
    DataError,
    PromptRecord,
    check_template,
    render_prompt,
    render_prompts,
    template_names,
)

CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</{{ m['role'] }}>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def char_tokenizer(chat_template: str | None = CHAT_TEMPLATE) -> PreTrainedTokenizerFast:
    """A character-level tokenizer built in memory: one token per character."""
    chars = "abcdefghijklmnopqrstuvwxyz0123456789+-*/=<>?,. "
    vocab = {c: i for i, c in enumerate(chars)} | {"[UNK]": len(chars)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    tokenizer.chat_template = chat_template
    return tokenizer


def test_plain_is_the_prompt_as_is():
    assert render_prompt("12+345=", "plain") == "12+345="


def test_r1_asks_for_think_and_answer_tags_and_ends_with_the_assistant_turn():
    text = render_prompt("What is 2+2?", "r1")
    assert "<think> reasoning process here </think><answer> answer here </answer>" in text
    assert text.endswith("User: What is 2+2?\nAssistant:")


def test_qwen_math_appends_the_boxed_instruction():
    assert render_prompt("2+2?", "qwen_math") == (
        "2+2?\nPlease reason step by step, and put your final answer within \\boxed{}."
    )


def test_braces_in_the_prompt_are_left_alone():
    assert render_prompt("f(x)={x}", "qwen_math").startswith("f(x)={x}\n")


def test_chat_template_wraps_text_as_a_user_message_with_generation_prompt():
    assert render_prompt("2+2?", "chat", char_tokenizer()) == "<user>2+2?</user><assistant>"


def test_chat_template_keeps_message_prompts():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert render_prompt(messages, "chat", char_tokenizer()) == (
        "<system>be brief</system><user>hi</user><assistant>"
    )


def test_unknown_template_lists_every_name():
    with pytest.raises(DataError) as err:
        render_prompt("x", "alpaca")
    assert str(err.value) == (
        "unknown prompt template 'alpaca': choose one of chat, plain, qwen_math, r1"
    )
    assert template_names() == ["chat", *sorted(TEMPLATES)]
    check_template("r1")  # a valid name passes


def test_chat_needs_a_tokenizer_with_a_chat_template():
    with pytest.raises(DataError, match="needs a tokenizer"):
        render_prompt("x", "chat")
    with pytest.raises(DataError, match="the tokenizer has no chat template: choose another"):
        render_prompt("x", "chat", char_tokenizer(chat_template=None))


def test_named_templates_refuse_chat_messages():
    with pytest.raises(DataError, match="formats text prompts.*use prompt_template 'chat'"):
        render_prompt([{"role": "user", "content": "hi"}], "plain")


def test_a_template_is_registered_by_adding_it_to_the_dict(monkeypatch):
    monkeypatch.setitem(TEMPLATES, "question", "Q: {prompt}\nA:")
    assert render_prompt("2+2?", "question") == "Q: 2+2?\nA:"


def test_render_prompts_counts_tokens_and_skips_long_prompts():
    records = [PromptRecord("1+2=", "3"), PromptRecord("123+456=", "579"), PromptRecord("9=", "9")]
    kept, skipped = render_prompts(records, "plain", char_tokenizer(), max_length=4)
    assert [(r.record.prompt, r.text, r.num_tokens) for r in kept] == [
        ("1+2=", "1+2=", 4),
        ("9=", "9=", 2),
    ]
    assert skipped == 1


def test_render_prompts_with_the_chat_template_counts_its_markup():
    kept, skipped = render_prompts([PromptRecord("ab")], "chat", char_tokenizer())
    # "<user>ab</user><assistant>": 6 + 2 + 7 + 11 characters
    assert (kept[0].num_tokens, skipped) == (26, 0)


def test_render_prompts_without_a_tokenizer():
    kept, skipped = render_prompts([PromptRecord("x")], "r1")
    assert kept[0].num_tokens is None and skipped == 0
    with pytest.raises(DataError, match="max_length counts tokens: pass the tokenizer"):
        render_prompts([PromptRecord("x")], "plain", max_length=8)
