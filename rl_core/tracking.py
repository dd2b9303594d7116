"""Where a run's params, metrics and artifacts go: MLflow when configured, else console and file.

`make_tracker(spec, output_dir)` returns one object with `log_params`, `log_metrics`,
`log_artifacts` and `finish`. A local `metrics.jsonl` is always written under the run's output
folder; MLflow is used whenever `MLFLOW_TRACKING_URI` is set, and `MLFLOW_RUN_ID` makes the run
log into a run the platform created beforehand. With MLflow, the node's resources are sampled
into the run as MLflow's system metrics (`tools.monitor.system_metrics_interval`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger("rl_core")

_MLFLOW_BATCH = 100  # MLflow's limit of params / metrics per log_batch call
_MLFLOW_PARAM_CHARS = 6000


class Tracker:
    """Fans calls out to several sinks; a failing remote sink never stops training."""

    def __init__(self, sinks: list[Any]):
        self.sinks = sinks

    def _each(self, method: str, *args, **kwargs) -> None:
        for sink in self.sinks:
            getattr(sink, method)(*args, **kwargs)

    def log_params(self, params: Mapping[str, str]) -> None:
        self._each("log_params", params)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._each("log_metrics", {k: float(v) for k, v in metrics.items()}, step)

    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> None:
        self._each("log_artifacts", Path(local_dir), artifact_path)

    def log_table(self, table: Mapping[str, list], artifact_file: str) -> None:
        """A table (column -> values, all as long) as the JSON table artifact `artifact_file`
        (MLflow's `log_table` format: {"columns": [...], "data": [[...], ...]})."""
        self._each("log_table", dict(table), artifact_file)

    def finish(self, status: str = "FINISHED") -> None:
        self._each("finish", status)

    @property
    def mlflow_run_id(self) -> str | None:
        return next((s.run_id for s in self.sinks if isinstance(s, MlflowSink)), None)


class FileSink:
    """metrics.jsonl (one object per logged step) and params.json in the output folder."""

    def __init__(self, output_dir: Path):
        output_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = output_dir / "metrics.jsonl"
        self.params_path = output_dir / "params.json"

    def log_params(self, params):
        self.params_path.write_text(json.dumps(dict(params), indent=1, sort_keys=True))

    def log_metrics(self, metrics, step):
        with self.metrics_path.open("a") as out:
            out.write(json.dumps({"step": step, **metrics}) + "\n")

    def log_artifacts(self, local_dir, artifact_path):
        pass  # artifacts already live in the output folder

    def log_table(self, table, artifact_file):
        path = self.metrics_path.parent / artifact_file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(table_json(table), ensure_ascii=False))

    def finish(self, status):
        pass


# The start of ConsoleSink's line for a step: the platform reads a run's progress from it.
STEP_LINE = re.compile(r"^step (\d+): ", re.MULTILINE)


class ConsoleSink:
    """One readable line per logged step (`step N: key=value ...`), on stderr."""

    KEYS = ("reward/mean", "val/accuracy", "actor/sft_loss", "actor/pg_loss", "actor/kl_loss", "actor/entropy",
            "response_length/mean", "perf/tokens_per_s", "timing/step")

    def log_params(self, params):
        pass

    def log_metrics(self, metrics, step):
        shown = [f"{k}={metrics[k]:.4g}" for k in self.KEYS if k in metrics]
        print(f"step {step}: " + " ".join(shown), file=sys.stderr, flush=True)

    def log_artifacts(self, local_dir, artifact_path):
        pass

    def log_table(self, table, artifact_file):
        pass

    def finish(self, status):
        pass


class MlflowSink:
    """Logs into one MLflow run through the client API (no global active-run state), and
    samples the node's resources into it every `system_metrics_interval` seconds (0: never)."""

    def __init__(self, tracking_uri: str, experiment_name: str, run_name: str | None,
                 run_id: str | None, tags: Mapping[str, str], system_metrics_interval: float = 0):
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri)
        if run_id:
            self.run_id = self.client.get_run(run_id).info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = self.client.get_experiment_by_name(experiment_name)
            experiment_id = (experiment.experiment_id if experiment
                             else self.client.create_experiment(experiment_name))
            run = self.client.create_run(experiment_id, run_name=run_name, tags=dict(tags))
            self.run_id = run.info.run_id
        self.monitor = (start_system_metrics(self.run_id, tracking_uri, system_metrics_interval)
                        if system_metrics_interval > 0 else None)

    def log_params(self, params):
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        items = [Param(k[:250], str(v)[:_MLFLOW_PARAM_CHARS]) for k, v in params.items()
                 if k[:250] not in existing]  # a resumed attempt logs the same params again
        for start in range(0, len(items), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=items[start:start + _MLFLOW_BATCH])

    def log_metrics(self, metrics, step):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step) for k, v in metrics.items() if math.isfinite(v)]
        for start in range(0, len(items), _MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=items[start:start + _MLFLOW_BATCH])

    def log_artifacts(self, local_dir, artifact_path):
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)

    def log_table(self, table, artifact_file):
        self.client.log_table(self.run_id, data=table, artifact_file=artifact_file)

    def finish(self, status):
        if self.monitor is not None:  # before the run ends: its last samples are sent first
            stop_system_metrics(self.monitor)
            self.monitor = None
        self.client.set_terminated(self.run_id, status=status)


def start_system_metrics(run_id: str, tracking_uri: str, interval_s: float):
    """MLflow's system-metrics sampler for the run (CPU, memory, disk, network; NVIDIA GPUs
    where nvidia-ml-py is installed), started; None when it cannot start (training goes on).
    A restarted attempt continues the samples' steps after the last one of the run."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval_s, resume_logging=True,
                                       tracking_uri=tracking_uri)
        # The spec's interval and the documented keys (`system/<name>`, no node in them) win
        # over MLflow's MLFLOW_SYSTEM_METRICS_* variables, should the node set them.
        monitor.sampling_interval, monitor.samples_before_logging = interval_s, 1
        monitor.node_id = None
        monitor.start()
    except Exception as exc:  # noqa: BLE001 - resource charts are never worth a failed run
        log.warning("not sampling the node's resources: %s", exc)
        return None
    return monitor


def stop_system_metrics(monitor) -> None:
    """Stop the sampler, then send the samples it took since its last send (MLflow's sampler
    drops them when stopped): a run shorter than the interval still gets its one sample."""
    monitor.finish()
    try:
        last = monitor.aggregate_metrics()
        if last:
            monitor.publish_metrics(last)
            monitor.mlflow_logger.flush()
    except Exception as exc:  # noqa: BLE001 - the run's own metrics are already sent
        log.warning("the last samples of the node's resources were not sent: %s", exc)


def table_json(table: Mapping[str, list]) -> dict[str, list]:
    """A column -> values table in the JSON form MLflow's `log_table` writes."""
    columns = list(table)
    return {"columns": columns, "data": [list(row) for row in zip(*(table[c] for c in columns))]}


def make_tracker(spec, output_dir: Path, environ: Mapping[str, str] | None = None) -> Tracker:
    env = os.environ if environ is None else environ
    sinks: list[Any] = [FileSink(output_dir)]
    if "console" in spec.trainer.logger:
        sinks.append(ConsoleSink())
    uri = env.get("MLFLOW_TRACKING_URI")
    if uri:
        name = spec.trainer.experiment_name or spec.trainer.project_name or "rl_core"
        tags = {"rl_core.algorithm": spec.algorithm, "attempt": env.get("ASCENT_ATTEMPT", "1")}
        sinks.append(MlflowSink(uri, name, spec.name, env.get("MLFLOW_RUN_ID"), tags,
                                system_metrics_interval=spec.tools.monitor.system_metrics_interval))
        log.info("tracking to MLflow run %s at %s", sinks[-1].run_id, uri)
    elif "mlflow" in spec.trainer.logger:
        log.info("MLFLOW_TRACKING_URI is not set: metrics go to %s only", output_dir / "metrics.jsonl")
    return Tracker(sinks)


class Timer:
    """Wall time per named stage of one step, as `timing/<stage>` metrics."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - start

    def metrics(self) -> dict[str, float]:
        return {f"timing/{k}": v for k, v in self.seconds.items()}


def stable_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics that do not depend on wall time or memory (for exact-resume comparisons): not
    timings, throughput, memory, or the latency of tools and reward services."""
    return {k: v for k, v in metrics.items()
            if not k.startswith(("timing/", "perf/tokens_per_s", "memory/"))
            and "/latency_" not in k and not (isinstance(v, float) and math.isnan(v))}


def memory_metrics(per_rank: list[Mapping[str, float]], role: str = "actor") -> dict[str, float]:
    """`memory/<role>/allocated_gb`, `memory/<role>/peak_gb` and per stage
    `memory/<role>/<stage>/peak_gb`: the largest over the ranks' `Worker.memory()` (or
    `rl_core.device.memory_stats`) figures in bytes."""
    keys = sorted({key for r in per_rank for key in r if key.endswith("_bytes")})
    return {f"memory/{role}/{key.removesuffix('_bytes')}_gb":
            max(r.get(key, 0.0) for r in per_rank) / 2**30 for key in keys}

def log_tool_files(tracker: Tracker, profile: Any, traces: list[str], precision: Any,
                   dumps: list[str]) -> dict[str, float]:
    """End a profiled or dumped step (`tools.*`): its traces go to the tracker as
    `profiles/step_<N>/`, its dumps as `precision/step_<N>/` (each plan's folder, None: not
    this step); returns how many files each wrote (`profile/traces`, `precision/files`)."""
    metrics = {}
    for plan, files, folder, key in ((profile, traces, "profiles", "profile/traces"),
                                     (precision, dumps, "precision", "precision/files")):
        if plan is None:
            continue
        log.info("%s of step %d: %d files in %s", folder, plan.step, len(files), plan.folder)
        if files:
            tracker.log_artifacts(plan.folder, f"{folder}/step_{plan.step}")
        metrics[key] = float(len(files))
    return metrics
