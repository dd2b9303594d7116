"""The tiny models' byte-level tokenizer: round trips, special tokens, chat template."""

import pytest
from transformers import AutoTokenizer

from rl_core.models.tiny import build_tiny, write_tiny
from rl_core.models.tokenizer import TAG_TOKENS, VOCAB, build_tiny_tokenizer

TEXTS = [
    "12+34=46",
    "What is 9876 + 1234?",
    "7*8 = 56\n(3-5)/2 = -1",
    "a , b . c ? it's",
    "  x\t\ty  \n\n",
    "3×4 = 12, café, 漢字",
    "<|im_start|>user\n<think>12+34</think><answer> 46</answer><|im_end|><|endoftext|>",
]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The tokenizer as AutoTokenizer reads it back from a saved tiny folder (transformers 5
    rebuilds a qwen2 folder's tokenizer with its own Qwen2Tokenizer)."""
    folder = write_tiny(*build_tiny("nano"), tmp_path_factory.mktemp("tok") / "nano")
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


@pytest.mark.parametrize("text", TEXTS[:5])
def test_ascii_text_round_trips_one_token_per_character(tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids == [ord(c) for c in text]  # id = byte value
    assert tokenizer.decode(ids) == text


def test_any_text_round_trips_one_token_per_utf8_byte(tokenizer):
    text = "3×4 漢"
    ids = tokenizer.encode(text)
    assert ids == list(text.encode())
    assert tokenizer.decode(ids) == text


def test_every_digit_is_its_own_token(tokenizer):
    assert tokenizer.encode("0123456789") == list(range(48, 58))


def test_ids_follow_the_documented_order(tokenizer):
    assert tokenizer.get_vocab() == {token: i for i, token in enumerate(VOCAB)}
    assert len(tokenizer) == len(VOCAB) == 256 + 3 + len(TAG_TOKENS) == 263
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        256, 257, 258
    ]


def test_special_tokens_are_single_ids_and_skipped_when_asked(tokenizer):
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    ids = tokenizer.encode("<|im_start|>user\n1+1<|im_end|><|endoftext|>")
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[-2:] == [tokenizer.eos_token_id, tokenizer.pad_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\n1+1"


def test_format_tags_are_single_tokens_kept_when_special_tokens_are_skipped(tokenizer):
    text = "<think>2+2 is 4</think><answer>4</answer>"
    ids = tokenizer.encode(text)
    assert tokenizer.convert_ids_to_tokens(ids)[0] == "<think>"
    assert len(ids) == 4 + len("2+2 is 4") + 1
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_no_bos_or_eos_is_added_on_encode(tokenizer):
    assert tokenizer.encode("1") == [49]
    assert tokenizer.bos_token is None


@pytest.mark.parametrize("text", TEXTS)
def test_saved_tokenizer_encodes_and_decodes_like_the_built_one(tokenizer, saved, text):
    ids = saved.encode(text)
    assert ids == tokenizer.encode(text)
    assert saved.decode(ids) == text
    assert saved.decode(ids, skip_special_tokens=True) == tokenizer.decode(
        ids, skip_special_tokens=True
    )


def test_saved_tokenizer_keeps_the_special_tokens(saved):
    assert (saved.eos_token, saved.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert len(saved) == 263
    assert saved.convert_tokens_to_ids("<think>") == VOCAB.index("<think>")


def test_chat_template_renders_chatml_with_a_generation_prompt(saved):
    messages = [
        {"role": "system", "content": "Add."},
        {"role": "user", "content": "What is 12+34?"},
    ]
    text = saved.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nAdd.<|im_end|>\n"
        "<|im_start|>user\nWhat is 12+34?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = saved.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    assert saved.decode(ids) == text


def test_chat_template_closes_assistant_turns_with_eos(saved):
    messages = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "2"}]
    text = saved.apply_chat_template(messages, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n2<|im_end|>\n")
