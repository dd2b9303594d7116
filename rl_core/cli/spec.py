"""The `spec` commands: validate a run spec (rl_core.admission, as the platform admits runs),
print its JSON Schema or its Markdown reference.

    python -m rl_core spec validate SPEC.yaml [dotted.key=value ...]
    python -m rl_core spec schema
    python -m rl_core spec docs
"""

from __future__ import annotations

import argparse
import json
import sys

from rl_core.admission import Facts, admit
from rl_core.errors import EXIT_INPUT
from rl_core.spec import SpecError, load_spec, spec_json_schema, spec_reference_markdown


def _spec_validate(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.file, args.overrides)
        refusals = admit(spec, Facts.here()).refusals
    except (SpecError, ValueError) as exc:  # ValueError: a malformed ASCENT_PATH_POLICY
        print(exc, file=sys.stderr)
        return EXIT_INPUT
    if refusals:
        print(SpecError(list(refusals)), file=sys.stderr)
        return EXIT_INPUT
    sys.stdout.write(spec.to_yaml())
    return 0


def _spec_schema(args: argparse.Namespace) -> int:
    print(json.dumps(spec_json_schema(), indent=2, ensure_ascii=False))
    return 0


def _spec_docs(args: argparse.Namespace) -> int:
    sys.stdout.write(spec_reference_markdown())
    return 0


def add_parser(commands: argparse._SubParsersAction) -> None:
    spec = commands.add_parser("spec", help="validate and describe run specs")
    actions = spec.add_subparsers(dest="action", required=True, metavar="ACTION")

    validate = actions.add_parser(
        "validate", help="resolve a spec file, check it as the platform admits runs (reward "
        "functions, the path policy in ASCENT_PATH_POLICY if set) and print it as YAML (exit 2 "
        "when invalid or refused)"
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
