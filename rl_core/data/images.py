"""The images of prompt records (vision-language runs): read, checked and limited before a run
trains on them.

    refs = image_refs(record_value)                   # what a record's `data.image_key` holds
    images = load_images(records, "train")            # {record index: [PIL RGB images]}

A record's image field holds one image or a list of them, each:

- a path: relative to the folder of the data file (as a dataset ships its pictures beside it),
  or absolute;
- raw bytes (a parquet binary column; jsonl cannot hold bytes);
- a mapping with `bytes` and/or `path`, as Hugging Face `datasets` stores an Image feature in
  parquet (bytes win when both are set).

Every image of every record is opened and decoded (PIL) when the run's data is read, before the
first step; all problems (a missing or unreadable file, bytes that are no image, more than
`MAX_IMAGES_PER_PROMPT` images, a file over `MAX_IMAGE_BYTES`, a picture over `MAX_IMAGE_PIXELS`
pixels) are raised as one `DataError` naming each record (file and row) and image index, so
nothing broken reaches a step. Images are converted to RGB (a palette or grey picture, an alpha
channel flattened on black). How large a picture reaches the model is the image processor's
business: Qwen2.5-VL resizes to between its `min_pixels` and `max_pixels`.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core.data.datasets import MAX_REPORTED, DataError, PromptRecord, image_refs
from rl_core.spec.limits import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS, MAX_IMAGES_PER_PROMPT

ImageRef = str | bytes | Mapping[str, Any]

__all__ = ["ImageRef", "image_refs", "load_image", "load_images", "pictures_of"]


def load_image(ref: ImageRef, base: Path) -> Any:
    """One image as a PIL RGB image; ValueError saying what is wrong with it."""
    from PIL import Image, UnidentifiedImageError

    data, name = _image_bytes(ref, base)
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"{name} is {len(data)} bytes, more than the limit of {MAX_IMAGE_BYTES}")
    try:
        with Image.open(io.BytesIO(data)) as probe:
            width, height = probe.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ValueError(f"{name} is {width} x {height} pixels, more than the limit of "
                                 f"{MAX_IMAGE_PIXELS}")
            probe.verify()  # a truncated or corrupt file fails here, not halfway through a step
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            return _rgb(image)
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise ValueError(f"{name} is not a readable image ({exc})") from None


def _image_bytes(ref: ImageRef, base: Path) -> tuple[bytes, str]:
    if isinstance(ref, Mapping):
        if ref.get("bytes"):
            return bytes(ref["bytes"]), "the image's bytes"
        if ref.get("path"):
            ref = ref["path"]
        else:
            raise ValueError("a mapping without 'bytes' or 'path'")
    if isinstance(ref, (bytes, bytearray)):
        return bytes(ref), "the image's bytes"
    path = Path(ref).expanduser()
    if not path.is_absolute():
        path = base / path
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    size = path.stat().st_size
    if size > MAX_IMAGE_BYTES:
        raise ValueError(f"{path} is {size} bytes, more than the limit of {MAX_IMAGE_BYTES}")
    return path.read_bytes(), str(path)


def _rgb(image: Any) -> Any:
    from PIL import Image

    if image.mode == "RGB":
        return image.copy()
    if "A" in image.getbands() or image.mode == "P":
        rgba = image.convert("RGBA")
        flat = Image.new("RGB", rgba.size)
        flat.paste(rgba, mask=rgba.getchannel("A"))
        return flat
    return image.convert("RGB")


def load_images(records: Sequence[PromptRecord], what: str) -> list[list[Any]]:
    """Every record's images (`PromptRecord.images`), decoded, in record order; one DataError
    listing the broken ones (see the module docstring)."""
    out: list[list[Any]] = []
    problems: list[str] = []
    for record in records:
        images = []
        if len(record.images) > MAX_IMAGES_PER_PROMPT:
            problems.append(f"{record.where}: {len(record.images)} images, more than the limit "
                            f"of {MAX_IMAGES_PER_PROMPT}")
        else:
            base = Path(record.source).parent
            for index, ref in enumerate(record.images):
                try:
                    images.append(load_image(ref, base))
                except ValueError as exc:
                    problems.append(f"{record.where}: image {index}: {exc}")
        out.append(images)
    if problems:
        shown = problems[:MAX_REPORTED]
        more = f" (and {len(problems) - len(shown)} more)" if len(problems) > len(shown) else ""
        raise DataError(f"{what} data: {len(problems)} image problem(s){more}: "
                        + "; ".join(shown))
    return out


def pictures_of(pixel_values: Any, image_grid_thw: Any, image_processor: Any) -> list[Any]:
    """The pictures one row of a batch shows its model, as PIL RGB images at the size the image
    processor resized them to: the row's patches (patches, C·T·P·P) and grids (images, 3: frames,
    rows, columns of patches; rows of 0 are padding) put back together and un-normalised (the
    first frame of each). The inverse of Qwen2-VL's patching: what the sample viewer shows."""
    import numpy as np
    from PIL import Image

    patch = int(image_processor.patch_size)
    merge = int(getattr(image_processor, "merge_size", 2))
    frames = int(getattr(image_processor, "temporal_patch_size", 2))
    mean = np.asarray(image_processor.image_mean, dtype=np.float32)[:, None, None]
    std = np.asarray(image_processor.image_std, dtype=np.float32)[:, None, None]
    scale = float(getattr(image_processor, "rescale_factor", 1 / 255))
    pixels = pixel_values.float().cpu().numpy()
    out, start = [], 0
    for t, h, w in image_grid_thw.reshape(-1, 3).tolist():
        if not t * h * w:
            continue
        count = t * h * w
        patches = pixels[start:start + h * w].reshape(  # the first frame's patches
            h // merge, w // merge, merge, merge, -1, frames, patch, patch)[..., 0, :, :]
        start += count
        # (h/m, w/m, m, m, C, p, p) -> (C, h/m, m, p, w/m, m, p) -> (C, H, W)
        image = patches.transpose(4, 0, 2, 5, 1, 3, 6).reshape(-1, h * patch, w * patch)
        rgb = (image * std + mean) / scale
        out.append(Image.fromarray(rgb.clip(0, 255).round().astype(np.uint8).transpose(1, 2, 0)))
    return out
