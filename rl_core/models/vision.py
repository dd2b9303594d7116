"""Tiny vision-language models: Qwen2.5-VL of the tiny text shapes with a small vision tower,
and their processor, built locally for tests and CPU runs.

    model, processor = build_tiny_vl("vl", seed=0)        # in memory
    folder = save_tiny_vl("/tmp/tiny-vl", "vl")            # a Hugging Face folder
    folder = resolve_tiny("vl")                            # cached build behind `tiny:vl`

The model is `Qwen2_5_VLForConditionalGeneration`: the vision tower cuts an image into 14-pixel
patches (two frames of each, as Qwen2.5-VL does for a still image), encodes them, merges each
2 × 2 block into one token of the text model's width, and those tokens take the places of the
prompt's `<|image_pad|>` tokens. Positions are Qwen2.5-VL's 3-D rotary positions (time, height,
width for the image's tokens, the same index thrice for text).

The tokenizer is the tiny byte tokenizer with the three vision tokens added after its
vocabulary (`<|vision_start|>` 263, `<|vision_end|>` 264, `<|image_pad|>` 265) and a chat
template that puts each image of a message where its content names one (`{"type": "image"}`),
inside `<|vision_start|>` ... `<|vision_end|>`; the image processor is Qwen2-VL's (its PIL
implementation: torchvision is not installed) sized for small pictures: an image is resized to
between `MIN_PIXELS` and `MAX_PIXELS` pixels in multiples of 28, so a 56 × 56 picture is 16
patches and 4 tokens. `ImagePrompter` turns a prompt and its images into token ids with one
`<|image_pad|>` per merged patch, the pixels and each image's grid, for the tiny folders and
Qwen2.5-VL's own alike (transformers' `Qwen2_5_VLProcessor` needs a video processor, which
needs torchvision).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import AddedToken
from typing import Any

from transformers import (
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from rl_core.models.presets import get_size, get_vision
from rl_core.models.tokenizer import EOS_TOKEN, PAD_TOKEN, VOCAB, build_tiny_tokenizer

VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD)
VL_VOCAB = VOCAB + VISION_TOKENS  # position = token id
PATCH = 14
MERGE = 2
MIN_PIXELS = 28 * 28
MAX_PIXELS = 112 * 112
ROPE_THETA = 10000.0

# The chat template of the tiny tokenizer with Qwen2-VL's image slots: a message's content is
# text, or a list of parts ({"type": "image"} or {"type": "text", "text": ...}).
VL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' %}{{ part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tiny_vl_config(name: str = "vl") -> Qwen2_5_VLConfig:
    """The config of the tiny vision-language model `name` (its text shape a tiny preset's)."""
    vision = get_vision(name)
    text = get_size(vision.text)
    head = text.hidden_size // text.num_attention_heads
    eighth = head // 2 // 8  # the rotary frequencies split time : height : width as 2 : 3 : 3
    text_config = {
        "hidden_size": text.hidden_size, "num_hidden_layers": text.num_hidden_layers,
        "num_attention_heads": text.num_attention_heads,
        "num_key_value_heads": text.num_key_value_heads,
        "intermediate_size": text.intermediate_size,
        "max_position_embeddings": text.max_position_embeddings,
        "vocab_size": len(VL_VOCAB), "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA,
                            "mrope_section": [2 * eighth, 3 * eighth, 3 * eighth]},
        "bos_token_id": None, "eos_token_id": VL_VOCAB.index(EOS_TOKEN),
        "pad_token_id": VL_VOCAB.index(PAD_TOKEN),
    }
    vision_config = {
        "depth": vision.depth, "hidden_size": vision.hidden_size, "num_heads": vision.num_heads,
        "intermediate_size": vision.intermediate_size, "patch_size": PATCH,
        "spatial_merge_size": MERGE, "temporal_patch_size": 2, "window_size": PATCH * MERGE * 2,
        "out_hidden_size": text.hidden_size,
        "fullatt_block_indexes": list(range(vision.depth)),
    }
    return Qwen2_5_VLConfig(
        text_config=text_config, vision_config=vision_config,
        image_token_id=VL_VOCAB.index(IMAGE_PAD), video_token_id=VL_VOCAB.index(IMAGE_PAD),
        vision_start_token_id=VL_VOCAB.index(VISION_START),
        vision_end_token_id=VL_VOCAB.index(VISION_END),
        tie_word_embeddings=True, architectures=["Qwen2_5_VLForConditionalGeneration"])


def build_vl_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """The tiny tokenizer with the vision tokens and the chat template with image slots."""
    tokenizer: PreTrainedTokenizerFast = build_tiny_tokenizer(model_max_length)
    tokenizer.add_special_tokens({"additional_special_tokens": [
        AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS]})
    tokenizer.chat_template = VL_CHAT_TEMPLATE
    if tokenizer.convert_tokens_to_ids(IMAGE_PAD) != VL_VOCAB.index(IMAGE_PAD):
        raise AssertionError("the vision tokens must follow the tiny vocabulary")
    return tokenizer


def build_image_processor() -> Qwen2VLImageProcessorPil:
    """Qwen2-VL's image processor for small pictures (see the module docstring)."""
    return Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
                                    patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2)


class ImagePrompt:
    """A prompt with images, as the model takes it: token ids with one `<|image_pad|>` per
    merged patch of each image (`ids`), the images' grids (images, 3: frames, rows, columns of
    patches) and their patches (patches, 3·2·14·14), cut from the pictures when first asked
    for: a dataset keeps its pictures, not their (larger) patches, and pickles without them."""

    def __init__(self, ids: list[int], pictures: list[Any], image_processor: Any,
                 image_grid_thw: torch.Tensor) -> None:
        self.ids, self.pictures, self.image_processor = ids, pictures, image_processor
        self.image_grid_thw = image_grid_thw
        self._pixels: torch.Tensor | None = None

    @property
    def pixel_values(self) -> torch.Tensor:
        if self._pixels is None:
            if not self.pictures:
                self._pixels = torch.zeros(0, 0)
            else:
                self._pixels = self.image_processor(images=self.pictures,
                                                    return_tensors="pt")["pixel_values"]
        return self._pixels

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pixels": None}


class ImagePrompter:
    """Prompts with images for a vision-language model: the tokenizer's chat template renders
    the messages (an image where a content part names one), the image processor cuts the
    images into patches, and each image's one `<|image_pad|>` becomes as many as the model
    merges its patches into."""

    def __init__(self, tokenizer: Any, image_processor: Any, image_token: str = IMAGE_PAD):
        self.tokenizer, self.image_processor = tokenizer, image_processor
        self.image_token = image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.merge = int(getattr(image_processor, "merge_size", MERGE))

    def __call__(self, text: str, images: list[Any]) -> ImagePrompt:
        """`text` (rendered: one image token per image, in order) and the images (PIL)."""
        slots = text.count(self.image_token)
        if slots != len(images):
            raise ValueError(f"the prompt has {slots} image slot(s) for {len(images)} image(s)")
        if not images:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            return ImagePrompt(ids, [], self.image_processor, torch.zeros(0, 3, dtype=torch.long))
        out = self.image_processor(images=images, return_tensors="pt")
        grids = out["image_grid_thw"]
        counts = (grids.prod(-1) // self.merge ** 2).tolist()
        pieces = text.split(self.image_token)
        expanded = pieces[0] + "".join(self.image_token * n + piece
                                       for n, piece in zip(counts, pieces[1:]))
        ids = self.tokenizer(expanded, add_special_tokens=False)["input_ids"]
        return ImagePrompt(ids, list(images), self.image_processor, grids)


def image_inputs(model: torch.nn.Module, input_ids: torch.Tensor, pixel_values: torch.Tensor,
                 image_grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
    """The keyword arguments of a vision-language model's forward for rows `input_ids` (B, T)
    with image columns (`rl_core.data.batch.IMAGE_COLUMNS`): every row's real patches and grids
    in row order, on
    the model's device in its dtype, and which tokens are images (`mm_token_type_ids`, what
    Qwen2.5-VL's 3-D positions are computed from). Rows without a picture among them: no
    pixels (the vision tower does not run), an empty grid (the positions are still the
    model's). One host sync: the rows' patch counts."""
    grids = image_grid_thw.reshape(-1, 3)
    real = grids.prod(-1) > 0
    counts = image_grid_thw.prod(-1).sum(-1).tolist()  # patches of each row
    param = next(model.parameters())
    token = model.config.image_token_id
    inputs = {"image_grid_thw": grids[real].to(param.device),
              "mm_token_type_ids": (input_ids == token).int().to(param.device)}
    if any(counts):
        pixels = torch.cat([pixel_values[row, :n] for row, n in enumerate(counts)])
        inputs["pixel_values"] = pixels.to(param.device, param.dtype)
    return inputs


@contextlib.contextmanager
def vision_tower_in_graph(model: torch.nn.Module) -> Iterator[None]:
    """Within it, each forward of vision-language `model` also runs its vision tower on a
    blank picture of one merged patch and adds 0 × its output to the token embeddings: the
    outputs are unchanged, and a backward gives the tower's parameters gradients (zeros).
    Data-parallel ranks reduce their gradients together (FSDP2 reduce-scatters those a
    backward produced): a rank whose rows hold no picture would otherwise reduce fewer than
    the others and the collective would not match (verl runs a blank image the same way)."""
    visual = model.model.visual
    config = visual.config
    merge = int(config.spatial_merge_size)
    width = int(config.in_channels * config.temporal_patch_size * config.patch_size ** 2)

    def touch(_module: torch.nn.Module, _args: Any, embeds: torch.Tensor) -> torch.Tensor:
        grid = torch.tensor([[1, merge, merge]], device=embeds.device)
        blank = torch.zeros(merge * merge, width, device=embeds.device, dtype=visual.dtype)
        features = visual(blank, grid_thw=grid).pooler_output
        return embeds + 0.0 * features.sum().to(embeds.dtype)

    handle = model.get_input_embeddings().register_forward_hook(touch)
    try:
        yield
    finally:
        handle.remove()


def image_positions(model: torch.nn.Module, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor, inputs: dict[str, torch.Tensor]
                    ) -> torch.Tensor:
    """The 3-D rotary positions (3, B, T) (temporal, height, width) of rows `input_ids` (B, T)
    with images (`inputs`: `image_inputs` of the rows), as the model computes them when not
    given any: what a packed forward hands it, its rows' positions laid side by side."""
    core = model.model  # the vision-language model under the LM head
    positions, _ = core.get_rope_index(input_ids, inputs["mm_token_type_ids"],
                                       image_grid_thw=inputs["image_grid_thw"],
                                       attention_mask=attention_mask)
    return positions


def build_tiny_vl(name: str = "vl", seed: int = 0
                  ) -> tuple[Qwen2_5_VLForConditionalGeneration, ImagePrompter]:
    """A freshly initialised tiny vision-language model (float32, eval mode) and its prompter
    (tokenizer and image processor); the same name and seed give the same weights, the global
    RNG left untouched."""
    config = tiny_vl_config(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = [config.text_config.eos_token_id,
                                            config.text_config.pad_token_id]
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    tokenizer = build_vl_tokenizer(config.text_config.max_position_embeddings)
    return model.eval(), ImagePrompter(tokenizer, build_image_processor())


def write_vl_folder(model: Qwen2_5_VLForConditionalGeneration, prompter: ImagePrompter,
                    folder: Path) -> None:
    """The model, its tokenizer (with the chat template) and its image processor in `folder`."""
    from rl_core.models.tokenizer import save_tiny_tokenizer

    model.save_pretrained(folder, safe_serialization=True)
    save_tiny_tokenizer(prompter.tokenizer, folder, chat_template=VL_CHAT_TEMPLATE)
    prompter.image_processor.save_pretrained(folder)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


__all__ = ["IMAGE_PAD", "ImagePrompt", "image_inputs", "image_positions", "ImagePrompter",
           "vision_tower_in_graph", "VISION_TOKENS",
           "build_image_processor", "build_tiny_vl", "build_vl_tokenizer",
           "tiny_vl_config", "write_vl_folder"]
