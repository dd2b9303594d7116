"""The `plan` command: the memory plan of a spec per device (rl_core.memory_plan).

    python -m rl_core plan SPEC.yaml [KEY=VALUE ...] [--device-memory-gb 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from rl_core.errors import EXIT_INPUT, InputError
from rl_core.admission import Facts, memory_verdict
from rl_core.memory_plan import GIB, format_table
from rl_core.spec import load_spec


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`python -m rl_core plan SPEC [KEY=VALUE ...] [--device-memory-gb N] [--json]`."""
    parser = commands.add_parser(
        "plan", help="print the memory plan of a spec per device (exit 2 when invalid)")
    parser.add_argument("file", help="YAML run spec")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted overrides, e.g. actor.ppo_micro_batch_size=1")
    parser.add_argument("--device-memory-gb", type=float, default=None, metavar="N",
                        help="memory of one device in GiB (default: by resources.device_type)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        spec = load_spec(args.file, args.overrides)
    except InputError as exc:  # a SpecError
        print(exc, file=sys.stderr)
        return EXIT_INPUT
    memory = None if args.device_memory_gb is None else int(args.device_memory_gb * GIB)
    verdict = memory_verdict(spec, Facts(device_memory_bytes=memory))
    if verdict.plan is None:
        print(verdict.reason, file=sys.stderr)
        return EXIT_INPUT
    result = verdict.plan
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_table(result))
    return 0
