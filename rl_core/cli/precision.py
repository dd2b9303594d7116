"""The `precision compare` command: where two precision dumps part (rl_core.precision).

    python -m rl_core precision compare A B [--out DIR] [--cosine-min X] [--abs-max X] [--rel-max X]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rl_core.errors import EXIT_FAILURE, EXIT_INPUT, InputError
from rl_core.precision import compare


def add_parser(commands: argparse._SubParsersAction) -> None:
    """`python -m rl_core precision compare A B [--out DIR] [--cosine-min X] ...`."""
    parser = commands.add_parser("precision", help="compare precision dumps (tools.precision)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    cmp = actions.add_parser(
        "compare", help="the first tensor where dump B parts from dump A (exit 0 none, 1 "
        "diverged, 2 bad input)")
    cmp.add_argument("a", help="reference dump: a run's precision folder, a step_<N>, a "
                     "<role>-rank<R> or a stage folder")
    cmp.add_argument("b", help="dump to check, at the same level")
    cmp.add_argument("--out", default=None, help="folder for report.json and report.csv "
                     "(default: <B>/compare_<name of A>)")
    cmp.add_argument("--cosine-min", type=float, default=0.9999,
                     help="lowest cosine similarity that passes (tensor mode; default 0.9999)")
    cmp.add_argument("--abs-max", type=float, default=1e-5,
                     help="largest absolute error that passes (default 1e-5)")
    cmp.add_argument("--rel-max", type=float, default=1e-3,
                     help="largest relative error that passes (default 1e-3)")
    cmp.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        report = compare(args.a, args.b, cosine_min=args.cosine_min, abs_max=args.abs_max,
                         rel_max=args.rel_max)
    except InputError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INPUT
    a, b = Path(args.a).resolve(), Path(args.b).resolve()
    name = a.name if a.name != b.name else f"{a.parent.name}_{a.name}"
    out = Path(args.out) if args.out else b / f"compare_{name}"
    out.mkdir(parents=True, exist_ok=True)
    report.to_json(out / "report.json")
    report.to_csv(out / "report.csv")
    print(report.summary())
    print(f"report: {out / 'report.json'}, {out / 'report.csv'}")
    return EXIT_FAILURE if report.diverged else 0
