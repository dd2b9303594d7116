"""A generated visual task with exact answers, for vision-language tests and tiny models:
counting the squares drawn in a picture.

    train, val = write_squares("/tmp/squares", num_train=2000, num_val=200, seed=0)
    # train.jsonl: {"prompt": "How many squares are in the picture?", "answer": "3",
    #               "images": ["images/train-00000.png"], "task": "squares"}

A picture is a `grid` × `grid` board of `cell`-pixel cells on a black ground; each cell holds a
square of a random bright colour (a few pixels smaller than the cell, at a random offset) or
stays empty, and the answer is the number of squares (0 to grid²). With the tiny Qwen2.5-VL
(`tiny:vl`: 14-pixel patches merged 2 × 2) and the default 28-pixel cells every cell is exactly
one of the image's tokens, so a tiny model can learn to count them. Pictures are PNG files in an
`images` folder beside the jsonl files, named by the records relative to it (the form
`rl_core.data.images` reads). Everything is seeded: training pictures from `seed`, validation
ones from `seed + 1` (random sizes, offsets and colours: no two pictures alike).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from rl_core.data.datasets import DataError, write_rows

QUESTION = "How many squares are in the picture?"
GRID, CELL = 2, 28
MARGIN = 4  # a square is at least this many pixels smaller than its cell


def draw_squares(cells: list[bool], rng: random.Random, grid: int = GRID,
                 cell: int = CELL) -> Any:
    """A PIL RGB picture of `grid` × `grid` cells, a coloured square in each cell marked True."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (grid * cell, grid * cell))
    draw = ImageDraw.Draw(image)
    for index, filled in enumerate(cells):
        if not filled:
            continue
        row, col = divmod(index, grid)
        side = rng.randint(cell // 2, cell - MARGIN)
        x = col * cell + rng.randint(0, cell - side)
        y = row * cell + rng.randint(0, cell - side)
        colour = tuple(rng.randint(128, 255) for _ in range(3))
        draw.rectangle([x, y, x + side - 1, y + side - 1], fill=colour)
    return image


def squares_problems(count: int, seed: int, folder: Path, prefix: str,
                     grid: int = GRID, cell: int = CELL) -> list[dict[str, Any]]:
    """`count` pictures written under `folder/images` and their records (paths relative to
    `folder`); the number of squares is uniform over 0..grid², then the cells holding them."""
    if count < 0 or grid < 1 or cell < 2 * MARGIN:
        raise DataError(f"squares: count must be >= 0, grid >= 1 and cell >= {2 * MARGIN}")
    rng = random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(count):
        squares = rng.randint(0, grid * grid)
        cells = [True] * squares + [False] * (grid * grid - squares)
        rng.shuffle(cells)
        name = f"images/{prefix}-{i:05d}.png"
        draw_squares(cells, rng, grid, cell).save(folder / name)
        rows.append({"prompt": QUESTION, "answer": str(squares), "images": [name],
                     "task": "squares"})
    return rows


def write_squares(out_dir: str | Path, *, num_train: int, num_val: int, seed: int,
                  grid: int = GRID, cell: int = CELL) -> tuple[Path, Path | None]:
    """`out_dir/train.jsonl` and (num_val > 0) `out_dir/val.jsonl` with their pictures."""
    if num_train <= 0 or num_val < 0:
        raise DataError(f"num_train must be positive and num_val non-negative, got {num_train} "
                        f"and {num_val}")
    out = Path(out_dir)
    train = squares_problems(num_train, seed, out, "train", grid, cell)
    val = squares_problems(num_val, seed + 1, out, "val", grid, cell)
    train_path = write_rows(train, out / "train.jsonl")
    val_path = write_rows(val, out / "val.jsonl") if val else None
    return train_path, val_path
