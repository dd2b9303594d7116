"""The command line of rl_core, one module per command group:

    python -m rl_core spec validate SPEC.yaml [dotted.key=value ...]   # spec.py
    python -m rl_core spec schema | docs                                # spec.py
    python -m rl_core plan SPEC.yaml [dotted.key=value ...]             # plan.py
    python -m rl_core make-tiny --size small --out DIR                  # models.py
    python -m rl_core make-data --task addition --digits 3 --out DIR    # data.py
    python -m rl_core train SPEC.yaml [dotted.key=value ...]            # run.py
    python -m rl_core sft SPEC.yaml [dotted.key=value ...]              # run.py
    python -m rl_core eval CHECKPOINT DATA [--k 8]                      # run.py
    python -m rl_core export CHECKPOINT OUT [--dtype bfloat16]          # run.py
    python -m rl_core precision compare A B [--out DIR]                 # precision.py

Each module registers its commands with `add_parser(commands)` (run.py: `add_parsers`), and each
command is a function from parsed arguments to an exit status. The library modules hold no
argparse. The modules are imported when the parser is built, so importing one command's module
(`rl_core.cli.models`) does not import the others, nor torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from rl_core.cli import data, models, plan, precision, run, spec

    parser = argparse.ArgumentParser(
        prog="python -m rl_core", description="Ascent RL training library."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    spec.add_parser(commands)
    plan.add_parser(commands)
    models.add_parser(commands)
    data.add_parser(commands)
    run.add_parsers(commands)
    precision.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)
