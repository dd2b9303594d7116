"""`ascent`: Ascent's runs from a terminal or a pipeline (CI jobs, schedulers).

    export ASCENT_URL=https://ascent.example.org ASCENT_TOKEN=asc_...
    ascent runs submit spec.yaml --experiment vision/counting --set trainer.total_steps=20 \\
        --wait --follow                     # streams the log; exits with the run's outcome
    ascent runs metrics 42 --keys reward/mean,val/accuracy --format csv
    ascent runs cancel 42
    ascent models register 42 --name qwen-math --alias champion --wait   # prints models:/...

Exit status: 0 the run SUCCEEDED (or, without --wait, the request was taken); 1 it FAILED;
3 it was CANCELLED; 2 bad input (a spec file that cannot be read, a spec the server refused,
an unknown experiment); 4 the server cannot be reached or refused the token; 5 --timeout
passed first; `models register --wait` exits 0 when the version is ready, 1 when its export
failed. Messages go to standard error; standard output holds the run id (submit), the log
(--follow), the metrics, or the version's id (register) or `models:/` path (register --wait).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

from ascent_client import ApiError, Client

EXIT = {"SUCCEEDED": 0, "FAILED": 1, "CANCELLED": 3}
BAD_INPUT, UNREACHABLE, TIMED_OUT = 2, 4, 5


def read_spec(path: str) -> dict[str, Any]:
    """A spec file (YAML or JSON) as a mapping; ValueError saying what is wrong."""
    import yaml

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the spec: {exc.strerror or exc}") from None
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not YAML or JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: a spec is a mapping of sections (algorithm, model, data, "
                         f"...), got {type(spec).__name__}")
    return spec


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _outcome(client: Client, run_id: int, follow: bool, timeout: float | None,
             poll: float) -> int:
    """Follow and/or wait for the run; its exit status."""
    if follow:
        for text in client.follow(run_id, timeout=timeout, poll=min(poll, 2.0)):
            sys.stdout.write(text)
            sys.stdout.flush()
    run = client.wait(run_id, timeout=timeout, poll=poll,
                      on_state=lambda r: say(f"run {run_id}: {r['state']}"
                                             + (f" ({r['waiting_reason']})"
                                                if r.get("waiting_reason") else "")))
    if run["state"] == "FAILED" and run.get("error"):
        say(f"run {run_id} failed: {run['error']}")
    return EXIT[run["state"]]


def cmd_submit(client: Client, args: argparse.Namespace) -> int:
    spec = read_spec(args.spec)
    experiment = f"{args.project}/{args.experiment}" if args.project else args.experiment
    key = args.idempotency_key or Client.pipeline_key(spec, args.set, experiment)
    run = client.submit(experiment, spec, overrides=args.set, name=args.name or "",
                        priority=args.priority, max_restarts=args.max_restarts,
                        cluster=args.cluster, idempotency_key=key,
                        preemptible=False if args.never_preempt else None)
    page = f"{client.url}/runs/{run['id']}/"
    if run["created"]:
        say(f"run {run['id']} submitted ({run['state']}): {page}")
    else:
        say(f"run {run['id']} was already submitted with Idempotency-Key {key}: nothing new "
            f"was queued ({run['state']}): {page}")
    if not args.follow:
        print(run["id"], flush=True)
    if not (args.wait or args.follow):
        return 0
    return _outcome(client, run["id"], args.follow, args.timeout, args.poll)


def cmd_show(client: Client, args: argparse.Namespace) -> int:
    print(json.dumps(client.run(args.run), indent=2))
    return 0


def cmd_wait(client: Client, args: argparse.Namespace) -> int:
    return _outcome(client, args.run, args.follow, args.timeout, args.poll)


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    run = client.cancel(args.run)
    say(f"run {args.run}: {run['state']}")
    return _outcome(client, args.run, False, args.timeout, args.poll) if args.wait else 0


def cmd_metrics(client: Client, args: argparse.Namespace) -> int:
    keys = [k.strip() for k in (args.keys or "").split(",") if k.strip()]
    if not keys:  # every metric the run logged
        keys = client.metrics(args.run)["keys"]
    data = client.metrics(args.run, keys, args.max_points)
    if args.format == "json":
        print(json.dumps(data, indent=2))
        return 0
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["key", "step", "value", "timestamp_ms"])
    for key in keys:
        for step, value, *rest in data.get("history", {}).get(key, []):
            out.writerow([key, int(step), value, int(rest[0]) if rest else ""])
    return 0


def cmd_register(client: Client, args: argparse.Namespace) -> int:
    version = client.register(args.run, args.name, step=args.step, aliases=args.alias,
                              description=args.description or "")
    say(f"run {args.run} step {version['step']}: version {version['id']} of {args.name} "
        "asked for; the server exports and registers it")
    if not args.wait:
        print(version["id"], flush=True)
        return 0
    version = client.wait_version(version["id"], poll=args.poll, timeout=args.timeout)
    if version["state"] != "ready":
        say(f"model version {version['id']} failed: {version['error']}")
        return EXIT["FAILED"]
    say(f"{version['uri']} is ready")
    print(version["uri"], flush=True)
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="ascent", description=__doc__.splitlines()[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  epilog="\n".join(__doc__.splitlines()[1:]))
    top.add_argument("--url", help="the server (default: $ASCENT_URL)")
    top.add_argument("--token", help="an API token (default: $ASCENT_TOKEN)")
    groups = top.add_subparsers(dest="group", required=True)
    runs = groups.add_parser("runs", help="submit, follow, cancel runs; read their metrics")
    commands = runs.add_subparsers(dest="command", required=True)

    def waiting(command: argparse.ArgumentParser) -> None:
        command.add_argument("--timeout", type=float, help="give up after this many seconds "
                             "(exit 5; the run goes on)")
        command.add_argument("--poll", type=float, default=5.0,
                             help="seconds between looks at the run (default 5)")

    submit = commands.add_parser("submit", help="submit a run from a spec file")
    submit.add_argument("spec", help="the spec (YAML or JSON; - reads standard input)")
    submit.add_argument("--experiment", required=True,
                        help="where the run goes: PROJECT/EXPERIMENT or an experiment id")
    submit.add_argument("--project", help="the project, when --experiment names only the "
                        "experiment")
    submit.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec field, e.g. --set trainer.total_steps=20 "
                        "(repeatable)")
    submit.add_argument("--name", help="the run's name")
    submit.add_argument("--priority", type=int, help="higher runs first")
    submit.add_argument("--max-restarts", type=int, help="automatic retries after a failure")
    submit.add_argument("--cluster", help="run only on this cluster (by name)")
    submit.add_argument("--never-preempt", action="store_true",
                        help="never stop this run for a more urgent one (default: it may be "
                        "preempted while its project holds more than its share, and resumes)")
    submit.add_argument("--idempotency-key", help="submit at most once per key (default: from "
                        "the pipeline's job, in GitHub Actions, GitLab CI, Airflow or Jenkins)")
    submit.add_argument("--wait", action="store_true",
                        help="wait for the run to end; exit with its outcome")
    submit.add_argument("--follow", action="store_true",
                        help="print the run's log as it grows (implies --wait)")
    waiting(submit)
    submit.set_defaults(handler=cmd_submit)

    show = commands.add_parser("show", help="a run as JSON")
    show.add_argument("run", type=int)
    show.set_defaults(handler=cmd_show)

    wait = commands.add_parser("wait", help="wait for a run to end; exit with its outcome")
    wait.add_argument("run", type=int)
    wait.add_argument("--follow", action="store_true", help="print its log as it grows")
    waiting(wait)
    wait.set_defaults(handler=cmd_wait)

    cancel = commands.add_parser("cancel", help="stop a run")
    cancel.add_argument("run", type=int)
    cancel.add_argument("--wait", action="store_true", help="wait until it has stopped")
    waiting(cancel)
    cancel.set_defaults(handler=cmd_cancel)

    metrics = commands.add_parser("metrics", help="a run's metrics, as CSV or JSON")
    metrics.add_argument("run", type=int)
    metrics.add_argument("--keys", help="comma-separated metric names (default: all)")
    metrics.add_argument("--format", choices=("csv", "json"), default="csv")
    metrics.add_argument("--max-points", type=int, help="points per metric, evenly down-sampled "
                         "(the server's default 500)")
    metrics.set_defaults(handler=cmd_metrics)

    models = groups.add_parser("models", help="register a run's checkpoint as a model version")
    model_commands = models.add_subparsers(dest="command", required=True)
    register = model_commands.add_parser(
        "register", help="a run's checkpoint as a new version of a model (models:/NAME/N)")
    register.add_argument("run", type=int)
    register.add_argument("--name", required=True, help="the model (new or of the run's project)")
    register.add_argument("--step", type=int, help="the checkpoint's step (default: the latest)")
    register.add_argument("--alias", action="append", default=[],
                          help="an alias for the version, e.g. champion (repeatable)")
    register.add_argument("--description", help="what the version is")
    register.add_argument("--wait", action="store_true",
                          help="wait until it is registered; print its models:/ path")
    waiting(register)
    register.set_defaults(handler=cmd_register)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        client = Client(args.url, args.token)
        return args.handler(client, args)
    except ValueError as exc:
        say(f"ascent: {exc}")
        return BAD_INPUT
    except ApiError as exc:
        say(f"ascent: {exc}")
        return BAD_INPUT if exc.status in (400, 404, 409, 413) else UNREACHABLE
    except ConnectionError as exc:
        say(f"ascent: {exc}")
        return UNREACHABLE
    except TimeoutError as exc:
        say(f"ascent: {exc}")
        return TIMED_OUT
    except KeyboardInterrupt:
        say("ascent: interrupted (the run goes on; `ascent runs cancel ID` stops it)")
        return 130


if __name__ == "__main__":
    sys.exit(main())
