"""The `make-data` command: write a synthetic task's train and validation files.

    python -m rl_core make-data --task addition --digits 3 --num-train 2000 --num-val 200 \\
        --seed 0 --out data/add3 [--format jsonl|parquet]

Registered by `rl_core.cli.build_parser` through `add_parser(commands)`.
"""

from __future__ import annotations

import argparse
import sys

from rl_core.data.datasets import DataError
from rl_core.data.synthetic import FORMATS, TASKS, write_synthetic

EXIT_INVALID_INPUT = 2

# Option name -> generator keyword, passed only when given.
_KNOBS = {"low": "low", "high": "high", "num_count": "num_count", "target_max": "target_max"}
_COUNTDOWN_ONLY = ("num_count", "target_max")


def make_data(args: argparse.Namespace) -> int:
    knobs = {kw: getattr(args, opt) for opt, kw in _KNOBS.items() if getattr(args, opt) is not None}
    misplaced = [k for k in _COUNTDOWN_ONLY if k in knobs and args.task != "countdown"]
    if misplaced:
        option = "--" + misplaced[0].replace("_", "-")
        print(f"{option} applies to --task countdown only", file=sys.stderr)
        return EXIT_INVALID_INPUT
    try:
        train, val = write_synthetic(
            args.out,
            args.task,
            num_train=args.num_train,
            num_val=args.num_val,
            seed=args.seed,
            fmt=args.format,
            digits=args.digits,
            **knobs,
        )
    except DataError as exc:
        print(str(exc).splitlines()[0], file=sys.stderr)
        return EXIT_INVALID_INPUT
    except OSError as exc:
        print(f"cannot write to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INVALID_INPUT
    print(f"wrote {train} ({args.num_train} {args.task} prompts)")
    if val is not None:
        print(f"wrote {val} ({args.num_val} {args.task} prompts)")
    return 0


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `make-data` on the top-level sub-command parsers."""
    parser = commands.add_parser(
        "make-data",
        help="write a synthetic task's train and validation files",
        description="Write OUT/train.<format> and OUT/val.<format> of a generated arithmetic "
        "task; train and validation share no problem.",
    )
    parser.add_argument("--task", choices=TASKS, default="addition", help="generated task")
    parser.add_argument("--digits", type=int, default=2, help="digits per operand (1-9)")
    parser.add_argument("--num-train", type=int, default=256, help="training prompts")
    parser.add_argument(
        "--num-val", type=int, default=32, help="validation prompts; 0 writes no val file"
    )
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument("--out", required=True, help="output folder (created if missing)")
    parser.add_argument("--format", choices=FORMATS, default="jsonl", help="file format")
    parser.add_argument("--low", type=int, help="smallest operand (default 0; countdown 1)")
    parser.add_argument("--high", type=int, help="largest operand (default: `digits` digits)")
    parser.add_argument("--num-count", type=int, help="countdown: numbers per problem (default 4)")
    parser.add_argument(
        "--target-max", type=int, help="countdown: largest target (default: digits+1 digits)"
    )
    parser.set_defaults(handler=make_data)
    return parser
