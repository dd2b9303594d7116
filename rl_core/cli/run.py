"""The `train`, `sft` and `eval` commands: one entry point for people, the platform and tests.

    python -m rl_core train SPEC.yaml [dotted.key=value ...] [--backend auto|local|ray]
    python -m rl_core sft SPEC.yaml [dotted.key=value ...]
    python -m rl_core eval CHECKPOINT DATA [--k 8] [--template plain] [--max-new-tokens 16]

`train` runs the recipe of the spec's algorithm (`rl_core.recipes`: RL for GRPO, DAPO and PPO,
DPO for dpo), `sft` the SFT recipe, `eval` the evaluation recipe. Backend `auto` (the default) runs the roles as Ray actors when
`RAY_ADDRESS` names a cluster (as inside a Ray job) or the spec asks for more than one device,
starting a local Ray when none is named; otherwise everything runs in this process.

Before anything is read, the spec's paths (eval: the checkpoint and data) are checked against
the cluster's path policy when the platform passes one in ASCENT_PATH_POLICY (rl_core.paths).

Exit status (`rl_core.errors.exit_code`): 0 on success; 2 for a spec or input error (a path
outside the policy too), which a retry cannot fix; 1 for any other failure; 143 when stopped by
SIGTERM (`train` finishes the step in progress and saves it first: rl_core.stopping). The last line on stderr always says why a run ended
badly, in one line.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import traceback
from collections.abc import Callable

from rl_core import stopping
from rl_core.errors import exit_code, is_input_error
from rl_core.paths import enforce_at_job
from rl_core.spec import load_spec


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class Terminated(BaseException):
    """SIGTERM (a cancelled or preempted run's Ray job is stopped with it), raised in the main
    thread so the work unwinds through its clean-up (roles shut down, the tracker closed)
    without a traceback."""


def _terminate(signum, frame) -> None:
    raise Terminated()


def _stop_after_step(signum, frame) -> None:
    """The first SIGTERM of a training run: finish the step, save, stop (rl_core.stopping)."""
    if stopping.requested():
        raise Terminated()
    stopping.request()
    print("stopping: asked to stop (SIGTERM): the step in progress ends and is saved as a "
          "checkpoint; a second SIGTERM stops at once", file=sys.stderr, flush=True)


def run_guarded(work: Callable[[], object], *, at_step_boundary: bool = False) -> int:
    """Run `work`, mapping its failure to an exit status and a one-line reason on stderr.
    at_step_boundary: the work is a training loop that honours rl_core.stopping, so the first
    SIGTERM lets it save the step in progress before it stops."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main = threading.current_thread() is threading.main_thread()  # only it may set handlers
    handler = _stop_after_step if at_step_boundary else _terminate
    previous = signal.signal(signal.SIGTERM, handler) if main else None
    stopping.set_handler(handler if main else None)
    stopping.clear()
    try:
        work()
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except stopping.Stopped as stop:
        print(f"stopped: asked to stop (SIGTERM), {stop}; a restart resumes from it",
              file=sys.stderr)
        return 143
    except Terminated:
        print("stopped: asked to stop (SIGTERM; a cancelled run is stopped so)", file=sys.stderr)
        return 143
    except BaseException as exc:  # noqa: BLE001 - every failure must end with its reason
        if is_input_error(exc):
            print(f"error: invalid input: {_one_line(exc)}", file=sys.stderr)
            return exit_code(exc)
        traceback.print_exc()
        print(f"error: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return exit_code(exc)
    finally:
        stopping.set_handler(None)
        if main:
            signal.signal(signal.SIGTERM, previous)
    return 0


def choose_backend(requested: str, spec) -> str:
    """`auto`: Ray when RAY_ADDRESS is set or the spec needs more than one device."""
    import os

    if requested != "auto":
        return requested
    return "ray" if os.environ.get("RAY_ADDRESS") or spec.world_size > 1 else "local"


def _train(args: argparse.Namespace) -> int:
    def work():
        from rl_core.recipes import run

        spec = load_spec(args.spec, args.overrides)
        enforce_at_job(spec)
        _print_summary(run(spec, backend=choose_backend(args.backend, spec)))

    return run_guarded(work, at_step_boundary=True)


def _sft(args: argparse.Namespace) -> int:
    def work():
        spec = load_spec(args.spec, args.overrides)
        enforce_at_job(spec)
        from rl_core.recipes.sft import SFTTrainer

        _print_summary(SFTTrainer(spec).fit())

    return run_guarded(work)


def _print_summary(summary: dict[str, float]) -> None:
    print(json.dumps({k: round(v, 6) for k, v in summary.items()}, sort_keys=True))


def _eval(args: argparse.Namespace) -> int:
    def work():
        enforce_at_job(named=[("checkpoint", "model", args.checkpoint), ("data", "data", args.data)])
        from rl_core.recipes.eval import evaluate_checkpoint

        result = evaluate_checkpoint(args.checkpoint, args.data, k=args.k, template=args.template,
                                     max_new_tokens=args.max_new_tokens, reward=args.reward,
                                     batch_size=args.batch_size,
                                     tools=[t for t in args.tools.split(",") if t],
                                     max_turns=args.max_turns)
        print(json.dumps(result, sort_keys=True))

    return run_guarded(work)


def _export(args: argparse.Namespace) -> int:
    def work():
        enforce_at_job(named=[("checkpoint", "model", args.checkpoint)])
        from rl_core.export import export_checkpoint

        print(json.dumps(export_checkpoint(args.checkpoint, args.out, args.dtype), sort_keys=True))

    return run_guarded(work)


def add_parsers(commands: argparse._SubParsersAction) -> None:
    for name, handler, text in (
        ("train", _train, "train a policy with RL (grpo, dapo, ppo, dpo) from a run spec"),
        ("sft", _sft, "supervised fine-tuning on the spec's prompts and answers (a warm start)"),
    ):
        parser = commands.add_parser(name, help=text)
        parser.add_argument("spec", help="YAML run spec")
        parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                            help="dotted overrides, e.g. trainer.total_steps=10")
        if name == "train":
            parser.add_argument("--backend", choices=("auto", "local", "ray"), default="auto",
                                help="where the roles run (default auto: Ray when RAY_ADDRESS "
                                     "is set or the spec needs more than one device)")
        parser.set_defaults(handler=handler)
    parser = commands.add_parser("eval", help="greedy accuracy and pass@k of a checkpoint on a dataset")
    parser.add_argument("checkpoint", help="a model folder (e.g. outputs/checkpoints/step_20)")
    parser.add_argument("data", help="jsonl or parquet file with prompt and answer fields")
    parser.add_argument("--k", type=int, default=0, help="also report pass@k from k samples")
    parser.add_argument("--template", default="plain", help="prompt template (default: plain)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--reward", default="exact_match", help="correctness reward function")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--tools", default="", help="multi-turn with these tools on offer, "
                        "comma-separated (e.g. calculator,python)")
    parser.add_argument("--max-turns", type=int, default=4,
                        help="with --tools: the model's turns per response (default 4)")
    parser.set_defaults(handler=_eval)
    parser = commands.add_parser(
        "export", help="write a checkpoint's policy as a Hugging Face folder (from the sharded "
                       "master weights of an fsdp2 run)")
    parser.add_argument("checkpoint", help="a checkpoint folder (outputs/checkpoints/step_N)")
    parser.add_argument("out", help="the folder to write (new or empty)")
    parser.add_argument("--dtype", default=None,
                        help="weights dtype: float32, bfloat16 or float16 (default: model.dtype "
                             "of the run)")
    parser.set_defaults(handler=_export)
