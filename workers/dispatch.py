"""Dispatch: the domain services the Celery tasks call (workers/tasks.py holds only shims).

    schedule()        QUEUED -> SCHEDULED by the placement function, one new Attempt each
    launch(run_id)    check the cluster's path policy; submit the attempt's Ray job (idempotent
                      by submission id) -> STARTING
    watch(run_id)     follow the job: logs, RUNNING, SUCCEEDED, FAILED (restart?), CANCELLED
    stop(run_id)      CANCELLING: stop the job (watch confirms CANCELLED)
    reconcile()       runs whose job vanished or went silent are restarted or failed
    probe(cluster_id) read a cluster's nodes from Ray into the inventory

Every state change goes through `experiments.services.transition` (a conditional UPDATE), so a
redelivered task or a second worker cannot act twice; the database is the source of truth and
Ray is asked again whenever in doubt. Ray and MLflow are reached only through
`workers.ray_jobs` and `experiments.mlflow_store`, imported when first used.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from clusters.choices import ClusterStatus, DeviceType, NodeState
from clusters.models import Cluster, Node
from clusters.services import cluster_capacity, clusters_allowing
from experiments.allocation import scheduling_inputs
from audit.services import record as record_event
from experiments.choices import ACTIVE_STATES, RunState, WaitingCause
from experiments.models import Attempt, LogChunk, Run
from experiments.placement import ActiveRun, QueuedRun, place, preempt
from experiments.services import IllegalTransition, notify_worker, transition
from rl_core.admission import POLICY_ENV, check_paths
from rl_core.tracking import STEP_LINE

log = logging.getLogger("ascent.dispatch")

SYSTEM = "system:dispatch"
EXIT_INPUT = 2  # rl_core's exit status for a spec or input error: a retry cannot fix it
WATCHED = (RunState.STARTING, RunState.RUNNING, RunState.PREEMPTING, RunState.CANCELLING)
_ERROR_LINE = re.compile(r"^error: .+$", re.MULTILINE)
# rl_core.cli.run's last line after a SIGTERM that let the run save its step.
_STOPPED_LINE = re.compile(r"^stopped: .*?stopped at step \d+: checkpoint (\S+) saved",
                           re.MULTILINE)


def ray_jobs(cluster: Cluster):
    from workers.ray_jobs import RayJobs

    return RayJobs(cluster.ray_address, token=settings.RAY_AUTH_TOKEN or None)


def tracking():
    from experiments.mlflow_store import Tracking

    return Tracking(settings.MLFLOW_TRACKING_URI)


def _quiet_transition(run: Run | int, target: RunState, **kwargs: Any) -> Run | None:
    """`transition`, or None when another actor already moved the run elsewhere."""
    try:
        return transition(run, target, actor=SYSTEM, **kwargs)
    except IllegalTransition as exc:
        log.info("run %s: %s", getattr(run, "pk", run), exc)
        return None


# --------------------------------------------------------------------------- schedule


def schedule(now=None) -> list[int]:
    """Place queued runs on clusters with free devices; returns the runs now SCHEDULED."""
    now = now or timezone.now()
    queued = list(Run.objects.filter(state=RunState.QUEUED)
                  .select_related("cluster", "experiment__project"))
    if not queued:
        return []
    clusters = list(Cluster.objects.exclude(status=ClusterStatus.OFFLINE))
    free, total = {}, {}
    for cluster in clusters:
        capacity = cluster_capacity(cluster)
        free[cluster.name] = {kind: c.free for kind, c in capacity.items()}
        total[cluster.name] = {kind: c.healthy for kind, c in capacity.items()}
    policies = [cluster.path_policy() for cluster in clusters]
    offline = set(Cluster.objects.filter(status=ClusterStatus.OFFLINE).values_list("name", flat=True))
    queue = [QueuedRun(id=r.pk, priority=r.priority, created_at=r.created_at.timestamp(),
                       device_type=r.device_type, device_count=r.device_count,
                       cluster=r.cluster.name if r.cluster else None,
                       allowed=None if r.cluster else clusters_allowing(job_spec(r), policies),
                       project=r.experiment.project.name)
             for r in queued]
    quotas, usage, weights = scheduling_inputs({run.project for run in queue})
    placements, waiting = place(queue, free, now=now.timestamp(), total=total,
                                aging_per_hour=settings.ASCENT_AGING_PER_HOUR,
                                quotas=quotas, usage=usage, weights=weights)
    by_name = {c.name: c for c in clusters}
    placed = []
    for decision in placements:
        if _claim(decision.run_id, by_name[decision.cluster]):
            placed.append(decision.run_id)
    queued_by_id = {r.pk: r for r in queued}
    if settings.ASCENT_PREEMPTION:
        by_id = {run.id: run for run in queue}
        blocked = [by_id[w.run_id] for w in waiting
                   if w.cause in (WaitingCause.CAPACITY, WaitingCause.SHARE)]
        if blocked:
            _preempt_for(blocked, queued_by_id, clusters, total, weights)
    for wait in waiting:
        run = queued_by_id[wait.run_id]
        reason, cause = wait.reason, wait.cause
        if run.cluster and run.cluster.name in offline and cause == WaitingCause.CAPACITY:
            reason = f"cluster {run.cluster.name} is offline: {run.cluster.last_probe_error or 'unreachable'}"
            cause = WaitingCause.CLUSTER
        if (run.waiting_reason, run.waiting_cause) != (reason[:500], cause):
            Run.objects.filter(pk=run.pk, state=RunState.QUEUED).update(
                waiting_reason=reason[:500], waiting_cause=cause)
    return placed


def _preempt_for(blocked: list[QueuedRun], queued: dict[int, Run], clusters: list[Cluster],
                 total: dict, weights: dict[str, float]) -> list[int]:
    """Stop the runs `placement.preempt` chooses for the blocked runs (PREEMPTING; their jobs
    save their step and end, then watch puts them back in the queue); returns their ids."""
    attempts = (Attempt.objects.filter(ended_at__isnull=True, run__state__in=ACTIVE_STATES)
                .select_related("run__experiment__project", "cluster"))
    active = [ActiveRun(
        id=a.run_id, priority=a.run.priority, project=a.run.experiment.project.name,
        device_type=a.run.device_type, device_count=a.device_count, cluster=a.cluster.name,
        started_at=a.started_at.timestamp(), preemptible=a.run.preemptible,
        stoppable=a.run.state in (RunState.STARTING, RunState.RUNNING) and bool(a.launched_at),
        preempting=a.run.state in (RunState.PREEMPTING, RunState.CANCELLING))
        for a in attempts]
    if not active:
        return []
    states = {a.run_id: a.run.state for a in attempts}
    free = {c.name: {kind: cap.free for kind, cap in cluster_capacity(c).items()}
            for c in clusters}
    stopped = []
    for decision in preempt(blocked, active, free, total=total, weights=weights):
        by = queued[decision.for_run]
        with transaction.atomic():
            run = _quiet_transition(decision.victim, RunState.PREEMPTING,
                                    expected=states[decision.victim], message=decision.reason)
            if run is None:
                continue
            record_event(action="run.preempt", object_type="run", object_id=str(run.pk),
                         object_repr=f"run {run.pk} {run.name}".strip(),
                         project=run.experiment.project, actor=by.created_by,
                         actor_name=by.created_by.get_username() if by.created_by else SYSTEM,
                         details={"for_run": by.pk, "cluster": decision.cluster,
                                  "reason": decision.reason})
        transaction.on_commit(lambda pk=run.pk: notify_worker("workers.tasks.stop_run", pk))
        stopped.append(run.pk)
    return stopped


def _claim(run_id: int, cluster: Cluster) -> bool:
    """QUEUED -> SCHEDULED on `cluster` with a new attempt holding its devices (one transaction)."""
    try:
        with transaction.atomic():
            run = _quiet_transition(run_id, RunState.SCHEDULED, expected=RunState.QUEUED,
                                    message=f"placed on cluster {cluster.name}")
            if run is None:
                return False
            _new_attempt(run, cluster)
            Run.objects.filter(pk=run_id).update(cluster=cluster, waiting_reason="",
                                                 waiting_cause="")
        return True
    except IntegrityError:  # another worker created the same attempt: it claimed the run
        return False


def _new_attempt(run: Run, cluster: Cluster) -> Attempt:
    number = (run.attempts.aggregate(n=Max("number"))["n"] or 0) + 1
    if number > 1:
        run.measure_pace_again()
    return Attempt.objects.create(run=run, number=number, cluster=cluster,
                                  ray_submission_id=Attempt.submission_id(run.pk, number),
                                  device_count=run.device_count)


def current_attempt(run: Run) -> Attempt | None:
    return run.attempts.order_by("-number").first()


# --------------------------------------------------------------------------- launch


def run_output_dir(run: Run) -> Path:
    return Path(settings.ASCENT_RUNS_DIR) / f"run-{run.pk}"


def job_spec(run: Run) -> dict[str, Any]:
    """The run's spec as the job trains it: its output under ASCENT_RUNS_DIR (shared by the
    attempts, so a restart resumes from the latest checkpoint) and MLflow logging on."""
    spec = dict(run.spec)
    trainer = dict(spec.get("trainer") or {})
    # A restart trains on in the output folder of the run it continues.
    trainer["output_dir"] = str(run_output_dir(run.resume_from or run))
    trainer["resume_mode"] = "auto"
    trainer.pop("resume_path", None)
    loggers = list(trainer.get("logger") or ["console"])
    trainer["logger"] = [*loggers, "mlflow"] if "mlflow" not in loggers else loggers
    spec["trainer"] = trainer
    return spec


def ensure_tracking(run: Run) -> str:
    """The MLflow run of this platform run (its experiment and run created once)."""
    if run.mlflow_run_id:
        return run.mlflow_run_id
    client = tracking()
    experiment = run.experiment
    if not experiment.mlflow_experiment_id:
        name = f"{experiment.project.name}/{experiment.name}"
        experiment_id = client.ensure_experiment(name, {"ascent.project": experiment.project.name})
        type(experiment).objects.filter(pk=experiment.pk).update(mlflow_experiment_id=experiment_id)
        experiment.mlflow_experiment_id = experiment_id
    run_id = client.create_run(experiment.mlflow_experiment_id, run.name or f"run-{run.pk}",
                               {"ascent.run": str(run.pk), "ascent.algorithm": run.algorithm,
                                **notes_tags(run)})
    # Only the first writer wins: a concurrent launch reuses what is stored.
    Run.objects.filter(pk=run.pk, mlflow_run_id="").update(mlflow_run_id=run_id)
    return Run.objects.values_list("mlflow_run_id", flat=True).get(pk=run.pk)


def launch(run_id: int) -> str | None:
    """Submit the current attempt of a SCHEDULED run; returns its submission id.

    Safe to repeat (a redelivered task): the job is found by its submission id. An unreachable
    cluster puts the run back in the queue with the reason, never fails it silently.
    """
    from workers.ray_jobs import ClusterError

    run = Run.objects.select_related("experiment__project").get(pk=run_id)
    if run.state != RunState.SCHEDULED:
        return None
    attempt = current_attempt(run)
    if attempt is None or attempt.ended_at is not None:
        log.warning("run %s is SCHEDULED without an open attempt: requeued", run_id)
        _quiet_transition(run, RunState.QUEUED, expected=RunState.SCHEDULED,
                          message="no open attempt")
        return None
    spec, policy = job_spec(run), attempt.cluster.path_policy()
    if refused := check_paths(spec, policy):
        _refuse_launch(run, attempt, refused)
        return None
    mlflow_run_id = ensure_tracking(run)
    env = {name: value for name in settings.ASCENT_JOB_ENV_PASSTHROUGH
           if (value := os.environ.get(name))}
    env.update({"MLFLOW_TRACKING_URI": settings.MLFLOW_TRACKING_URI, "MLFLOW_RUN_ID": mlflow_run_id,
                "ASCENT_RUN_ID": str(run.pk), "ASCENT_ATTEMPT": str(attempt.number),
                "PYTHONUNBUFFERED": "1", POLICY_ENV: policy.to_json(),
                # Ray's job supervisor waits this long after SIGTERM before it kills the job:
                # the run finishes and saves its step (rl_core.stopping).
                "RAY_JOB_STOP_WAIT_TIME_S": str(settings.ASCENT_STOP_GRACE_S)})
    folder = Path(tempfile.mkdtemp(prefix=f"ascent-run-{run.pk}-"))
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    try:
        ray_jobs(attempt.cluster).submit(
            attempt.ray_submission_id,
            f"{settings.ASCENT_JOB_PYTHON} -m rl_core train spec.yaml",
            runtime_env={"working_dir": str(folder), "env_vars": env},
            metadata={"ascent_run": str(run.pk), "ascent_attempt": str(attempt.number)})
    except ClusterError as exc:
        with transaction.atomic():
            Attempt.objects.filter(pk=attempt.pk).update(
                ended_at=timezone.now(), exit_message=f"not launched: {exc}")
            _quiet_transition(run, RunState.QUEUED, expected=RunState.SCHEDULED,
                              message=f"cluster {attempt.cluster.name} unreachable; back in the queue")
            Run.objects.filter(pk=run.pk).update(
                waiting_reason=f"cluster {attempt.cluster.name}: {exc}"[:500],
                waiting_cause=WaitingCause.CLUSTER)
        return None
    Attempt.objects.filter(pk=attempt.pk, launched_at__isnull=True).update(launched_at=timezone.now())
    _quiet_transition(run, RunState.STARTING, expected=RunState.SCHEDULED,
                      message=f"Ray job {attempt.ray_submission_id} submitted")
    return attempt.ray_submission_id


def _refuse_launch(run: Run, attempt: Attempt, refused: list[dict[str, str]]) -> None:
    """FAILED without a job: the cluster's path policy (changed since submit) refuses the spec."""
    reason = "path policy: " + "; ".join(e["message"] for e in refused)
    with transaction.atomic():
        _end_attempt(attempt, EXIT_INPUT, f"not launched: {reason}")
        _quiet_transition(run, RunState.FAILED, expected=RunState.SCHEDULED, error=reason[:10000],
                          message=f"not launched on cluster {attempt.cluster.name}")



def watch_all() -> list[int]:
    """Watch every run with a job; returns runs that need a launch (restarts)."""
    relaunch = []
    for run_id in Run.objects.filter(state__in=WATCHED).values_list("pk", flat=True):
        try:
            if watch(run_id):
                relaunch.append(run_id)
        except Exception:  # noqa: BLE001 - one run's trouble must not stop the others
            log.exception("watching run %s", run_id)
    return relaunch


def watch(run_id: int) -> bool:
    """Follow one run's current job; returns True when a new attempt must be launched."""
    from workers.ray_jobs import ClusterError

    run = Run.objects.get(pk=run_id)
    attempt = current_attempt(run)
    if run.state not in WATCHED or attempt is None or attempt.ended_at is not None:
        return False
    jobs = ray_jobs(attempt.cluster)
    try:
        job = jobs.status(attempt.ray_submission_id)
        if job.status != "MISSING":
            read_logs(jobs, attempt)
    except ClusterError as exc:
        log.info("run %s: cluster %s unreachable: %s", run_id, attempt.cluster.name, exc)
        return False  # reconcile decides once the silence lasts too long
    Attempt.objects.filter(pk=attempt.pk).update(last_seen_at=timezone.now())
    if run.state == RunState.CANCELLING:
        if job.terminal or job.status == "MISSING":
            _end_attempt(attempt, job.exit_code, job.message)
            _quiet_transition(run, RunState.CANCELLED, expected=RunState.CANCELLING,
                              message="Ray job stopped")
        else:
            jobs.stop(attempt.ray_submission_id)
        return False
    if run.state == RunState.PREEMPTING:
        if job.status == "SUCCEEDED":  # it finished before the stop reached it
            _end_attempt(attempt, job.exit_code if job.exit_code is not None else 0, job.message)
            _quiet_transition(run, RunState.SUCCEEDED, expected=RunState.PREEMPTING,
                              message="training finished before the preemption stopped it")
            _terminate_tracking(run, "FINISHED")
        elif job.terminal or job.status == "MISSING":
            _requeue_preempted(run, attempt, job.exit_code, failure_reason(attempt, job)
                               if job.status != "MISSING" else "the Ray job vanished")
        else:  # in case stop_run's message was lost; Ray signals a stopping job only once
            jobs.stop(attempt.ray_submission_id)
        return False
    if job.status == "RUNNING" and run.state == RunState.STARTING:
        _quiet_transition(run, RunState.RUNNING, expected=RunState.STARTING, message="Ray job running")
    elif job.status == "SUCCEEDED":
        _end_attempt(attempt, job.exit_code if job.exit_code is not None else 0, job.message)
        _quiet_transition(run, RunState.SUCCEEDED, expected=run.state, message="training finished")
        _terminate_tracking(run, "FINISHED")
    elif job.status in ("FAILED", "STOPPED"):
        reason = failure_reason(attempt, job)
        _end_attempt(attempt, job.exit_code, reason)
        return fail_or_restart(run, attempt, reason, retryable=job.exit_code != EXIT_INPUT)
    elif job.status == "MISSING" and attempt.launched_at is None:
        return False  # submitted in a moment (or relaunched by reconcile)
    elif job.status == "MISSING":
        reason = "the Ray job vanished (the cluster's head may have restarted)"
        _end_attempt(attempt, None, reason)
        return fail_or_restart(run, attempt, reason, retryable=True)
    return False


def _requeue_preempted(run: Run, attempt: Attempt, exit_code: int | None, how: str) -> None:
    """A preempted run's job ended: back to the queue (its next attempt resumes from the
    checkpoint the job saved on its way out); the attempt does not count as a restart."""
    Attempt.objects.filter(pk=attempt.pk).update(preempted=True)
    _end_attempt(attempt, exit_code, f"preempted: {how}")
    saved = _STOPPED_LINE.search(attempt_log(attempt))
    where = f"saved {saved.group(1)}" if saved else "stopped before saving a new checkpoint"
    with transaction.atomic():
        if _quiet_transition(run, RunState.QUEUED, expected=RunState.PREEMPTING,
                             message=f"preempted: its job {where}; back in the queue, it "
                                     "resumes from its latest checkpoint when placed again"):
            Run.objects.filter(pk=run.pk).update(
                waiting_reason="preempted: waits to be placed again", waiting_cause="")
    notify_worker("workers.tasks.schedule_runs")


def read_logs(jobs, attempt: Attempt) -> int:
    """Store the job log's new text as a LogChunk; returns the characters added."""
    text, offset = jobs.logs(attempt.ray_submission_id, offset=attempt.log_offset)
    if not text:
        return 0
    with transaction.atomic():
        updated = Attempt.objects.filter(pk=attempt.pk, log_offset=attempt.log_offset).update(
            log_offset=offset)
        if updated:  # a concurrent watcher stored this piece already otherwise
            LogChunk.objects.create(attempt=attempt, offset=attempt.log_offset, text=text)
    attempt.log_offset = offset
    steps = [int(m) for m in STEP_LINE.findall(text)]
    if steps:
        attempt.run.record_progress(max(steps), timezone.now())
    return len(text)


def attempt_log(attempt: Attempt) -> str:
    return "".join(attempt.log_chunks.order_by("offset").values_list("text", flat=True))


def failure_reason(attempt: Attempt, job) -> str:
    """The job's last `error: ...` line (rl_core writes one last on stderr), else Ray's message."""
    tail = attempt_log(attempt)[-20000:]
    lines = _ERROR_LINE.findall(tail)
    if lines:
        return lines[-1][len("error: "):].strip()
    code = f" (exit code {job.exit_code})" if job.exit_code is not None else ""
    return (job.message or f"the Ray job {job.status.lower()}") + code


def _end_attempt(attempt: Attempt, exit_code: int | None, message: str) -> None:
    Attempt.objects.filter(pk=attempt.pk, ended_at__isnull=True).update(
        ended_at=timezone.now(), exit_code=exit_code, exit_message=(message or "")[:10000])


def fail_or_restart(run: Run, attempt: Attempt, reason: str, *, retryable: bool) -> bool:
    """A new attempt from the latest checkpoint when allowed (True: launch it), else FAILED."""
    restarts = attempt.number - 1 - run.attempts.filter(preempted=True).count()
    if retryable and restarts < run.max_restarts:
        moved = _quiet_transition(run, RunState.RESTARTING, expected=run.state,
                                  message=f"attempt {attempt.number} failed: {reason}; restarting "
                                          f"from the latest checkpoint ({restarts + 1}/{run.max_restarts})")
        if moved is None:
            return False
        with transaction.atomic():
            _new_attempt(moved, attempt.cluster)
            _quiet_transition(moved, RunState.SCHEDULED, expected=RunState.RESTARTING,
                              message=f"attempt {attempt.number + 1} on cluster {attempt.cluster.name}")
        return True
    why = reason if retryable else f"{reason} (a spec or input error: not retried)"
    if retryable and run.max_restarts:
        why = f"{reason} (after {restarts} restart(s))"
    _quiet_transition(run, RunState.FAILED, expected=run.state, error=why[:10000],
                      message=f"attempt {attempt.number} failed")
    _terminate_tracking(run, "FAILED")
    return False


def notes_tags(run: Run) -> dict[str, str]:
    """The MLflow tags that carry a run's note and tags: the note is the MLflow run's
    description (`mlflow.note.content`, shown on its page), the tags one comma-separated tag."""
    return {"mlflow.note.content": run.note, "ascent.tags": ", ".join(run.tag_names)}


def sync_notes(run_id: int) -> None:
    """Copy the run's current note and tags to its MLflow run (after an edit)."""
    run = Run.objects.prefetch_related("tags").get(pk=run_id)
    if run.mlflow_run_id:
        tracking().set_tags(run.mlflow_run_id, notes_tags(run))


def _terminate_tracking(run: Run, status: str) -> None:
    run = Run.objects.get(pk=run.pk)
    if not run.mlflow_run_id:
        return
    try:
        tracking().set_terminated(run.mlflow_run_id, status)
    except Exception:  # noqa: BLE001 - the run's state is what matters; MLflow may be down
        log.warning("run %s: could not mark the MLflow run %s", run.pk, status, exc_info=True)


# --------------------------------------------------------------------------- cancel


def stop(run_id: int) -> None:
    """Ask the cluster to stop a CANCELLING or PREEMPTING run's job (watch confirms the end)."""
    from workers.ray_jobs import ClusterError

    run = Run.objects.get(pk=run_id)
    if run.state not in (RunState.CANCELLING, RunState.PREEMPTING):
        return
    attempt = current_attempt(run)
    if run.state == RunState.PREEMPTING and (attempt is None or attempt.launched_at is None):
        return  # never chosen so: preempt() stops only launched jobs
    if attempt is None or attempt.launched_at is None:
        if attempt is not None:
            _end_attempt(attempt, None, "cancelled before launch")
        _quiet_transition(run, RunState.CANCELLED, expected=RunState.CANCELLING,
                          message="cancelled before its job started")
        return
    try:
        ray_jobs(attempt.cluster).stop(attempt.ray_submission_id)
    except ClusterError as exc:
        log.warning("run %s: stop failed, will retry: %s", run_id, exc)


# --------------------------------------------------------------------------- reconcile


def reconcile(now=None) -> list[int]:
    """Runs that would otherwise hang: returns those that need a launch.

    - SCHEDULED runs (a launch lost with its worker) are launched again (idempotent);
    - watched runs not heard of for ASCENT_SILENCE_LIMIT_S (cluster unreachable, job vanished)
      are restarted from their checkpoint or failed, with the reason.
    """
    now = now or timezone.now()
    relaunch = list(Run.objects.filter(state=RunState.SCHEDULED).values_list("pk", flat=True))
    limit = timedelta(seconds=settings.ASCENT_SILENCE_LIMIT_S)
    for run in Run.objects.filter(state__in=WATCHED):
        attempt = current_attempt(run)
        if attempt is None or attempt.ended_at is not None:
            continue
        seen = attempt.last_seen_at or attempt.launched_at or attempt.started_at
        if now - seen < limit:
            continue
        reason = (f"no news of Ray job {attempt.ray_submission_id} on cluster "
                  f"{attempt.cluster.name} for {int((now - seen).total_seconds())} s")
        if run.state == RunState.PREEMPTING:
            _requeue_preempted(run, attempt, None, reason)
            continue
        _end_attempt(attempt, None, reason)
        if run.state == RunState.CANCELLING:
            _quiet_transition(run, RunState.CANCELLED, expected=RunState.CANCELLING, message=reason)
        elif fail_or_restart(run, attempt, reason, retryable=True):
            relaunch.append(run.pk)
    return relaunch


# --------------------------------------------------------------------------- probe


def probe(cluster_id: int) -> None:
    """Read the cluster's nodes from Ray into the inventory; unreachable -> OFFLINE + reason."""
    from workers.ray_jobs import ClusterError

    cluster = Cluster.objects.get(pk=cluster_id)
    now = timezone.now()
    try:
        nodes = ray_jobs(cluster).cluster_resources()
    except ClusterError as exc:
        Cluster.objects.filter(pk=cluster.pk).update(status=ClusterStatus.OFFLINE,
                                                     last_probe_at=now, last_probe_error=str(exc))
        return
    seen = set()
    for node in nodes:
        hostname = node.get("hostname") or node.get("node_name") or node["node_id"]
        if hostname in seen and not node.get("alive"):
            continue  # a dead earlier incarnation of a node that is back
        seen.add(hostname)
        resources = node.get("resources") or {}
        device_type, count = _devices(cluster, resources)
        alive = bool(node.get("alive"))
        defaults = {"address": node.get("node_ip") or None, "device_type": device_type,
                    "device_count": count, "healthy_device_count": count if alive else 0,
                    "cpu_count": int(resources.get("CPU", 0))}
        existing = Node.objects.filter(cluster=cluster, hostname=hostname).first()
        if existing is None:
            Node.objects.create(cluster=cluster, hostname=hostname, last_seen=now if alive else None,
                                state=NodeState.READY if alive else NodeState.DOWN, **defaults)
            continue
        for key, value in defaults.items():
            setattr(existing, key, value)
        if alive:
            existing.last_seen = now
            if existing.state == NodeState.DOWN:
                existing.state = NodeState.READY  # came back; a drained node stays drained
        else:
            existing.state = NodeState.DOWN
        existing.save()
    live = [n for n in nodes if n.get("alive")]
    status = ClusterStatus.ONLINE if live and len(live) == len(seen) else (
        ClusterStatus.DEGRADED if live else ClusterStatus.OFFLINE)
    Cluster.objects.filter(pk=cluster.pk).update(status=status, last_probe_at=now,
                                                 last_probe_error="")


def _devices(cluster: Cluster, resources: dict[str, float]) -> tuple[str, int]:
    """The node's device model and count from its Ray resources."""
    if resources.get("NPU"):
        model = cluster.labels.get("npu_model", DeviceType.ASCEND_910B)
        return model, int(resources["NPU"])
    if resources.get("GPU"):
        model = cluster.labels.get("gpu_model", DeviceType.NVIDIA_OTHER)
        return model, int(resources["GPU"])
    return DeviceType.CPU, int(resources.get("CPU", 0))
