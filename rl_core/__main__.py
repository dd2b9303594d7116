"""Command line of rl_core.

    python -m rl_core spec validate SPEC.yaml [dotted.key=value ...]   # print the resolved spec
    python -m rl_core spec schema                                       # JSON Schema of the spec
    python -m rl_core spec docs                                         # Markdown field reference
    python -m rl_core plan SPEC.yaml [dotted.key=value ...]             # memory per device
    python -m rl_core make-tiny --size small --out DIR                  # a tiny HF model folder
    python -m rl_core make-data --task addition --digits 3 --out DIR    # synthetic train/val files
    python -m rl_core train SPEC.yaml [dotted.key=value ...]            # RL training (grpo, dapo)
    python -m rl_core sft SPEC.yaml [dotted.key=value ...]              # supervised warm start
    python -m rl_core eval CHECKPOINT DATA [--k 8]                      # accuracy and pass@k
    python -m rl_core export CHECKPOINT OUT [--dtype bfloat16]          # a Hugging Face folder
    python -m rl_core precision compare A B [--out DIR]                 # where two dumps part

Each command is a function from parsed arguments to an exit status; new command groups (train,
sft, eval) add a `_add_<group>` function and a line in `build_parser`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rl_core.cli import add_parsers as _add_run_commands
from rl_core.data.cli import add_parser as _add_make_data
from rl_core.errors import EXIT_INPUT as EXIT_INVALID_SPEC
from rl_core.memory_plan import add_parser as _add_plan
from rl_core.models.cli import add_parser as _add_make_tiny
from rl_core.precision import add_parser as _add_precision
from rl_core.spec import SpecError, load_spec, spec_json_schema, spec_reference_markdown


def _spec_validate(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.file, args.overrides)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID_SPEC
    sys.stdout.write(spec.to_yaml())
    return 0


def _spec_schema(args: argparse.Namespace) -> int:
    print(json.dumps(spec_json_schema(), indent=2, ensure_ascii=False))
    return 0


def _spec_docs(args: argparse.Namespace) -> int:
    sys.stdout.write(spec_reference_markdown())
    return 0


def _add_spec(commands: argparse._SubParsersAction) -> None:
    spec = commands.add_parser("spec", help="validate and describe run specs")
    actions = spec.add_subparsers(dest="action", required=True, metavar="ACTION")

    validate = actions.add_parser(
        "validate", help="resolve a spec file and print it as YAML (exit 2 when invalid)"
    )
    validate.add_argument("file", help="YAML run spec")
    validate.add_argument(
        "overrides",
        nargs="*",
        metavar="KEY=VALUE",
        help="dotted overrides, e.g. rollout.n_samples_per_prompt=8",
    )
    validate.set_defaults(handler=_spec_validate)

    actions.add_parser("schema", help="print the JSON Schema of the run spec").set_defaults(
        handler=_spec_schema
    )
    actions.add_parser("docs", help="print the Markdown reference of every field").set_defaults(
        handler=_spec_docs
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rl_core", description="Ascent RL training library."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_spec(commands)
    _add_plan(commands)
    _add_make_tiny(commands)
    _add_make_data(commands)
    _add_run_commands(commands)
    _add_precision(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
