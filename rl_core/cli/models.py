"""The `make-tiny` command: build a tiny model and save it as a Hugging Face folder.

    python -m rl_core make-tiny --size small --out DIR [--seed 0] [--hidden-size N --layers N ...]

Prints the folder, the parameter count and the vocabulary size, one `key: value` per line
after the folder. Registered by `rl_core.cli.build_parser` through `add_parser(commands)`; torch and
transformers are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys

from rl_core.models.presets import TINY_SIZES

EXIT_INVALID_INPUT = 2

# option -> TinySize field
_SHAPE_OPTIONS = {
    "--hidden-size": "hidden_size",
    "--layers": "num_hidden_layers",
    "--heads": "num_attention_heads",
    "--kv-heads": "num_key_value_heads",
    "--intermediate-size": "intermediate_size",
    "--max-positions": "max_position_embeddings",
}


def _make_tiny(args: argparse.Namespace) -> int:
    from rl_core.models.tiny import build_tiny, count_parameters, write_tiny

    overrides = {field: getattr(args, field) for field in _SHAPE_OPTIONS.values()}
    try:
        model, tokenizer = build_tiny(args.size, args.seed, **overrides)
        folder = write_tiny(model, tokenizer, args.out, overwrite=args.force)
    except (ValueError, FileExistsError) as exc:
        print(f"make-tiny: {exc}", file=sys.stderr)
        return EXIT_INVALID_INPUT
    except OSError as exc:
        print(f"make-tiny: {args.out}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INVALID_INPUT
    print(folder)
    print(f"parameters: {count_parameters(model)}")
    print(f"vocab_size: {len(tokenizer)}")
    return 0


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `make-tiny` on the top-level subcommands of `python -m rl_core`."""
    parser = commands.add_parser(
        "make-tiny",
        help="build a tiny Qwen2 model and its byte tokenizer; save them as a HF folder",
        description="Build a tiny Qwen2 model (seeded) with its byte-level tokenizer (one token "
        "per ASCII character) and save them as a Hugging Face folder. Sizes: "
        + "; ".join(
            f"{name}: hidden {s.hidden_size}, {s.num_hidden_layers} layers"
            for name, s in TINY_SIZES.items()
        ),
    )
    parser.add_argument("--size", choices=list(TINY_SIZES), default="small", help="preset")
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="folder to write (must be absent or empty)"
    )
    parser.add_argument("--seed", type=int, default=0, help="initialisation seed (default 0)")
    parser.add_argument("--force", action="store_true", help="replace an existing --out folder")
    shape = parser.add_argument_group("shape overrides (default: the preset's)")
    for option, field in _SHAPE_OPTIONS.items():
        shape.add_argument(option, dest=field, type=int, metavar="N", help=field)
    parser.set_defaults(handler=_make_tiny)
    return parser
