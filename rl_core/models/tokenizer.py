"""The tokenizer of the tiny models: one token per byte, so one token per ASCII character.

One token per character keeps arithmetic learnable by a tiny model: every digit is its own
token, so "1234+5678" has the same structure at every length. The vocabulary (ids in order):

- the 256 bytes (id = byte value: "0" is 48, "+" is 43, space is 32, newline is 10), written
  in the byte-level alphabet of GPT-2 and Qwen ("Ġ" for space, "Ċ" for newline); any text
  round-trips, a non-ASCII character taking one token per UTF-8 byte;
- special tokens `<|endoftext|>` (256, padding), `<|im_start|>` (257), `<|im_end|>` (258, end
  of a turn and eos);
- the format tags `<think>`, `</think>`, `<answer>`, `</answer>` (259-262), single tokens so a
  format reward is cheap to learn. They are *normal* added tokens (as `<think>` is in Qwen3):
  decoding with `skip_special_tokens=True` keeps them, so reward functions see them.

Technically it is Qwen2's byte-level BPE with no merges. That is deliberate: transformers 5
loads any folder whose config says `qwen2` with its own Qwen2Tokenizer, which rebuilds the
pipeline from the vocabulary in tokenizer.json; a tokenizer with Qwen2's pipeline is the one
that survives that unchanged (transformers 4 and vLLM read tokenizer.json as is).

Eos is `<|im_end|>` and pad is `<|endoftext|>`, as in Qwen2.5-Instruct: with a chat template a
response ends with `<|im_end|>`, and a pad distinct from eos keeps eos tokens from being
mistaken for padding. The chat template is the im_start/im_end (ChatML) style of Qwen, without
a default system message (shorter prompts).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
EOS_TOKEN = IM_END
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")

# Qwen2's pre-tokenizer split (transformers' tokenization_qwen2.PRETOKENIZE_REGEX). With no
# merges it does not change the tokens; it is kept so the pipeline is exactly Qwen2's.
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _byte_alphabet() -> tuple[str, ...]:
    """GPT-2's printable stand-in for each byte value 0..255 (bytes_to_unicode)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    shifted = iter(range(256, 512))
    return tuple(chr(b) if b in kept else chr(next(shifted)) for b in range(256))


BYTE_TOKENS = _byte_alphabet()
VOCAB = BYTE_TOKENS + SPECIAL_TOKENS + TAG_TOKENS  # position = token id


def build_tiny_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """The tiny models' tokenizer (see the module docstring), with the chat template set."""
    backend = Tokenizer(
        models.BPE(
            vocab={token: i for i, token in enumerate(BYTE_TOKENS)},
            merges=[],
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def save_tiny_tokenizer(tokenizer: PreTrainedTokenizerFast, folder: str | Path,
                        chat_template: str = CHAT_TEMPLATE) -> None:
    """Save `tokenizer` as a Hugging Face tokenizer folder readable by transformers 4 and 5.

    Besides what `save_pretrained` writes (tokenizer.json, tokenizer_config.json,
    chat_template.jinja), the config names the class `Qwen2Tokenizer` (what transformers 5
    uses for a qwen2 folder anyway) and holds the chat template, and special_tokens_map.json
    is written, as older readers expect.
    """
    folder = Path(folder)
    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update(tokenizer_class="Qwen2Tokenizer", chat_template=chat_template)
    config_path.write_text(
        json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    special = {
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "additional_special_tokens": [IM_START, IM_END],
    }
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
