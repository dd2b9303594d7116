"""Domain actions on runs and experiments: submit, transition, cancel, clone, restart, tags and
notes; creating an experiment.

Every state change goes through `transition`, a conditional UPDATE (`WHERE state = <seen>`)
that writes a RunEvent in the same transaction, so a redelivered message or a second worker
acting on the same run cannot both succeed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from ascent.errors import DomainError, RequestError  # raised here; the API and UI answer them
from clusters.choices import DeviceKind, NodeState, kind_of
from clusters.models import Cluster, Node
from clusters.services import node_memory
from experiments.choices import ACTIVE_STATES, TERMINAL_STATES, RunState, can_transition
from experiments.limits import MAX_RESTARTS, PRIORITY
from experiments.models import Experiment, Run, RunEvent, RunTag, planned_steps
from rl_core.admission import (
    DEFAULT_DEVICE_MODEL,
    Facts,
    MemoryVerdict,
    admit,
    device_memory_of,
)
from rl_core.spec import RunSpec, SpecError, resolve_spec

# How often `transition` re-reads a run whose state changed under it before giving up.
_TRANSITION_TRIES = 3
# Checks of a submitted spec that other apps add in their AppConfig.ready() (the model registry:
# `models:/` paths), each called as check(spec, project, user) and raising SpecError.
SPEC_CHECKS: list = []


class IllegalTransition(DomainError):
    def __init__(self, run_id: int, current: str, target: str, hint: str = ""):
        self.run_id, self.current, self.target = run_id, current, target
        text = f"Run {run_id} is {current}; it cannot move to {target}."
        super().__init__(f"{text} {hint}".strip())


def notify_worker(task: str, *args) -> None:
    """Queue a dispatch task now; when the broker is down, the worker's periodic tasks pick the
    change up within seconds anyway, so a failure is only logged."""
    from ascent.celery import send

    try:
        send(task, *args)
    except Exception:  # noqa: BLE001 - never fail a request because the broker is down
        logging.getLogger("ascent.dispatch").warning("could not queue %s", task, exc_info=True)


def actor_name(user) -> str:
    return user.get_username() if user is not None and user.is_authenticated else "anonymous"


def transition(
    run: Run | int,
    target: RunState | str,
    *,
    actor: str,
    message: str = "",
    expected: RunState | str | None = None,
    error: str | None = None,
) -> Run:
    """Move a run to `target` and record a RunEvent; returns the fresh run.

    With `expected`, the move happens only from that state (the caller acted on what it saw).
    Raises IllegalTransition when the current state does not allow the move.
    """
    run_id = run if isinstance(run, int) else run.pk
    target = RunState(target)
    for _ in range(_TRANSITION_TRIES):
        current = Run.objects.filter(pk=run_id).values_list("state", flat=True).get()
        if expected is not None and current != expected:
            raise IllegalTransition(run_id, current, target, f"(expected {expected})")
        if not can_transition(current, target):
            raise IllegalTransition(run_id, current, target)
        with transaction.atomic():
            if _conditional_update(run_id, current, target, error):
                RunEvent.objects.create(
                    run_id=run_id, from_state=current, to_state=target, actor=actor, message=message
                )
                return Run.objects.get(pk=run_id)
        # Another actor changed the state between the read and the UPDATE: judge it again.
    current = Run.objects.filter(pk=run_id).values_list("state", flat=True).get()
    raise IllegalTransition(run_id, current, target, "(it kept changing concurrently)")


def _conditional_update(run_id: int, current: str, target: RunState, error: str | None) -> bool:
    now = timezone.now()
    updates: dict = {"state": target, "updated_at": now}
    if target == RunState.RUNNING:
        updates["started_at"] = Coalesce("started_at", now)
    if target in TERMINAL_STATES:
        updates["finished_at"] = now
    if error is not None:
        updates["error"] = error
    return Run.objects.filter(pk=run_id, state=current).update(**updates) == 1


@dataclass(frozen=True)
class Submission:
    """What a submit or a dry run needs beyond the spec itself."""

    spec: Mapping
    overrides: Sequence[str] = ()
    name: str = ""
    priority: int = PRIORITY.default
    max_restarts: int = MAX_RESTARTS.default
    preemptible: bool = True
    cluster: Cluster | None = None
    idempotency_key: str = ""
    ignore_memory_plan: bool = False  # submit even when the memory plan says it does not fit

    def fingerprint(self, experiment: Experiment) -> str:
        """What makes two submissions the same request, for an idempotency key."""
        body = {
            "experiment": experiment.pk, "spec": self.spec, "overrides": list(self.overrides),
            "name": self.name, "priority": self.priority, "max_restarts": self.max_restarts,
            "cluster": self.cluster.pk if self.cluster else None,
        }
        if not self.preemptible:  # keys of submissions made before the field stay the same
            body["preemptible"] = False
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def check_cluster(spec: RunSpec, cluster: Cluster | None) -> None:
    """A requested cluster must offer the device kind the spec asks for."""
    kind = spec.device_request()["device_type"]
    if cluster is not None and kind != DeviceKind.CPU and cluster.device_type != kind:
        raise RequestError(
            "cluster",
            f"Cluster {cluster.name} provides {cluster.device_type} devices but the spec asks for "
            f"{kind}: set spec resources.device_type={cluster.device_type} or pick another cluster.",
        )


# Ends a refusal of trainer.output_dir: the user cannot change where the platform writes.
_OUTPUT_NOTE = (" (the platform writes every run's output under ASCENT_RUNS_DIR: an admin must "
                "add it to the cluster's output_roots)")


def facts_for(spec: RunSpec, cluster: Cluster | None) -> Facts:
    """What the inventory knows of where `spec` could go: `cluster`, or every cluster offering
    its device kind (any cluster for cpu), with their path policies, their nodes' host memory
    and their largest healthy device."""
    kind = spec.device_request()["device_type"]
    if cluster is not None:
        candidates = [cluster]
    elif kind == DeviceKind.CPU:
        candidates = list(Cluster.objects.all())
    else:
        candidates = list(Cluster.objects.filter(device_type=kind))
    model, where = _largest_device(kind, cluster)
    return Facts(
        policies=tuple(c.path_policy() for c in candidates),
        cluster=cluster.name if cluster else None,
        output_dir=str(settings.ASCENT_RUNS_DIR), output_note=_OUTPUT_NOTE,
        nodes=tuple(node_memory(kind, cluster)), device_model=model, device_cluster=where,
    )


def _largest_device(kind: str, cluster: Cluster | None) -> tuple[str | None, str | None]:
    """(device model, cluster name) of the largest healthy device of `kind` that placement
    could use; (the kind's default model, None) when the inventory has none."""
    if kind == DeviceKind.CPU:
        return None, None
    clusters = [cluster] if cluster else Cluster.objects.filter(device_type=kind)
    nodes = Node.objects.filter(cluster__in=clusters, state=NodeState.READY,
                                healthy_device_count__gt=0).values_list("device_type",
                                                                        "cluster__name")
    found = [(model, name) for model, name in nodes if kind_of(model) == kind]
    if found:
        return max(found, key=lambda item: device_memory_of(item[0]) or 0)
    return DEFAULT_DEVICE_MODEL.get(kind), None


@dataclass(frozen=True)
class Prepared:
    """A submission resolved and admitted: the spec and its memory verdict."""

    spec: RunSpec
    memory: MemoryVerdict


class MemoryRefusal(RequestError):
    """A submission whose memory plan does not fit the devices it could get (HTTP 400)."""

    def __init__(self, verdict: MemoryVerdict):
        self.verdict = verdict
        super().__init__("spec", f"memory plan: {verdict.plan.message}. Change the spec, or set "
                                 "ignore_memory_plan to submit anyway.")


def prepare(submission: Submission) -> Prepared:
    """Resolve and admit a submission without saving anything (the dry run): SpecError with
    every refusal of rl_core's admission, RequestError for a cluster of another device kind.
    A memory plan that does not fit is only the verdict here (`submit_run` refuses it)."""
    spec = resolve_spec(submission.spec, submission.overrides)
    check_cluster(spec, submission.cluster)
    admission = admit(spec, facts_for(spec, submission.cluster))
    if admission.refusals:
        raise SpecError(list(admission.refusals))
    return Prepared(spec, admission.memory)


def check_spec(spec: RunSpec, project, user) -> None:
    """The checks other apps add (SPEC_CHECKS), for a submission of `user` (to `project`, or
    None for a dry run): SpecError naming each refused field."""
    for check in SPEC_CHECKS:
        check(spec, project, user)


def submit_run(experiment: Experiment, user, submission: Submission) -> tuple[Run, bool]:
    """Store a validated run as QUEUED. Returns (run, created).

    A repeated submission with the same idempotency key by the same user returns the first run;
    the same key with a different request is a conflict.
    """
    fingerprint = submission.fingerprint(experiment) if submission.idempotency_key else ""
    if submission.idempotency_key:
        existing = _run_for_key(user, submission.idempotency_key, fingerprint)
        if existing is not None:
            return existing, False
    prepared = prepare(submission)
    if prepared.memory.does_not_fit and not submission.ignore_memory_plan:
        raise MemoryRefusal(prepared.memory)
    spec = prepared.spec
    check_spec(spec, experiment.project, user)
    request = spec.device_request()
    try:
        with transaction.atomic():
            _lock_experiment(experiment)
            run = Run.objects.create(
                experiment=experiment,
                name=submission.name or spec.name or "",
                spec=spec.model_dump(mode="json"),
                algorithm=spec.algorithm,
                priority=submission.priority,
                device_type=request["device_type"],
                device_count=request["device_count"],
                planned_steps=planned_steps(spec.model_dump(mode="json")),
                cluster=submission.cluster,
                max_restarts=submission.max_restarts,
                preemptible=submission.preemptible,
                created_by=user,
                idempotency_key=submission.idempotency_key,
                idempotency_fingerprint=fingerprint,
            )
            RunEvent.objects.create(
                run=run, from_state="", to_state=RunState.QUEUED, actor=actor_name(user),
                message="submitted",
            )
        transaction.on_commit(lambda: notify_worker("workers.tasks.schedule_runs"))
    except IntegrityError:
        # Two submissions with one key raced past the lookup; the other one was stored.
        existing = submission.idempotency_key and _run_for_key(
            user, submission.idempotency_key, fingerprint
        )
        if existing:
            return existing, False
        raise
    return run, True


def _run_for_key(user, key: str, fingerprint: str) -> Run | None:
    existing = Run.objects.filter(created_by=user, idempotency_key=key).first()
    if existing is not None and existing.idempotency_fingerprint != fingerprint:
        raise DomainError(
            f"Idempotency-Key {key!r} was already used for run {existing.pk} with a different "
            "request: send a new key for a new run."
        )
    return existing


def lock_rows(queryset) -> list[int]:
    """Lock `queryset`'s rows (FOR UPDATE) until the transaction ends, in id order and only in
    its own table (a model's default ordering could join, and lock, another table's rows:
    Experiment's orders by its project's name); their ids."""
    return list(queryset.select_for_update(of=("self",)).order_by("pk")
                .values_list("pk", flat=True))


def _lock_experiment(experiment: Experiment) -> None:
    """Hold the experiment's row until the transaction ends, so a run is never created in an
    experiment (or project) that a concurrent delete is removing: whichever comes second finds
    the other's result (the run, and the delete refuses; or no experiment, a 409 here)."""
    if not lock_rows(Experiment.objects.filter(pk=experiment.pk)):
        raise DomainError(f"Experiment {experiment.pk} was deleted meanwhile: submit the run to "
                          "another experiment.")


def delete_experiment(experiment: Experiment) -> None:
    """Delete an experiment with no unfinished run, atomically against concurrent submits,
    clones and restarts into it (they lock its row too)."""
    with transaction.atomic():
        lock_rows(Experiment.objects.filter(pk=experiment.pk))
        ensure_no_active_runs(Run.objects.filter(experiment=experiment), "experiment")
        experiment.delete()


def delete_project(project) -> None:
    """Delete a project with no unfinished run; its experiments' rows are locked first, so no
    run is created in them meanwhile."""
    with transaction.atomic():
        lock_rows(type(project).objects.filter(pk=project.pk))
        lock_rows(Experiment.objects.filter(project=project))
        ensure_no_active_runs(Run.objects.filter(experiment__project=project), "project")
        project.delete()


def ensure_no_active_runs(runs, what: str) -> None:
    """Refuse to delete something whose runs could still hold devices or a Ray job."""
    active = runs.exclude(state__in=TERMINAL_STATES).count()
    if active:
        raise DomainError(
            f"This {what} has {active} unfinished run(s): cancel them and wait until they "
            "finish before deleting it."
        )


def cancel_run(run: Run, user) -> Run:
    """Cancel now if nothing was launched; otherwise ask the worker to stop it (CANCELLING)."""
    actor = actor_name(user)
    if run.state == RunState.CANCELLING:
        return run
    if run.state == RunState.QUEUED:
        return transition(run, RunState.CANCELLED, actor=actor, message="cancelled before launch",
                          expected=RunState.QUEUED)
    if run.state in ACTIVE_STATES:
        run = transition(run, RunState.CANCELLING, actor=actor, message="cancel requested",
                         expected=run.state)
        transaction.on_commit(lambda: notify_worker("workers.tasks.stop_run", run.pk))
        return run
    raise IllegalTransition(run.pk, run.state, RunState.CANCELLING, "It has already finished.")


def clone_run(run: Run, user, *, overrides: Sequence[str] = (), name: str = "",
              priority: int | None = None, ignore_memory_plan: bool = False) -> Run:
    """A new QUEUED run with the same spec (plus overrides) in the same experiment."""
    submission = Submission(
        spec=run.spec,
        overrides=overrides,
        name=name or (f"{run.name} (clone)" if run.name else ""),
        priority=run.priority if priority is None else priority,
        max_restarts=run.max_restarts,
        preemptible=run.preemptible,
        cluster=run.cluster,
        ignore_memory_plan=ignore_memory_plan,
    )
    clone, _ = submit_run(run.experiment, user, submission)
    Run.objects.filter(pk=clone.pk).update(cloned_from=run)
    clone.refresh_from_db()
    return clone


def restart_run(run: Run, user) -> Run:
    """A new QUEUED run that continues a failed or cancelled run from its latest checkpoint.

    It trains in the same output folder as the run it restarts (the first run of a chain of
    restarts), with the same spec and settings, so the trainer's `resume_mode: auto` picks up the
    last checkpoint saved there. At most one run of a chain may be unfinished at a time: the
    chain's first run is locked while the check and the new run are made, so of concurrent
    restarts one wins and the others find it (a DomainError, the API's 409).
    """
    if run.state not in (RunState.FAILED, RunState.CANCELLED):
        raise IllegalTransition(
            run.pk, run.state, RunState.QUEUED,
            "Only failed or cancelled runs restart from their checkpoint: clone it instead.")
    root = run.resume_from or run
    with transaction.atomic():
        _lock_experiment(run.experiment)  # first, as deletes do: no two locks in opposite orders
        lock_rows(Run.objects.filter(pk=root.pk))
        chain = Run.objects.filter(Q(pk=root.pk) | Q(resume_from=root))
        busy = chain.exclude(state__in=TERMINAL_STATES).first()
        if busy is not None:
            raise DomainError(f"Run {busy.pk} already continues run {root.pk}'s checkpoints and "
                              "has not finished: wait for it or cancel it first.")
        name = run.name.removesuffix(" (restart)")
        submission = Submission(spec=run.spec, name=f"{name} (restart)" if name else "",
                                priority=run.priority, max_restarts=run.max_restarts,
                                preemptible=run.preemptible, cluster=run.cluster,
                                ignore_memory_plan=True)  # already accepted
        restart, _ = submit_run(run.experiment, user, submission)
        Run.objects.filter(pk=restart.pk).update(cloned_from=run, resume_from=root)
    restart.refresh_from_db()
    return restart


def annotate_run(run: Run, *, tags: Sequence[str] | None = None, note: str | None = None) -> Run:
    """Replace the run's tags and/or its note (None keeps what it has). `tags` are already
    clean (experiments.validation). MLflow's copy follows: the worker sets the MLflow run's
    description (`mlflow.note.content`) and `ascent.tags`."""
    with transaction.atomic():
        if not lock_rows(Run.objects.filter(pk=run.pk)):
            raise DomainError(f"Run {run.pk} was deleted meanwhile.")
        if tags is not None:
            existing = {tag.name: tag.pk for tag in RunTag.objects.filter(run=run)}
            RunTag.objects.filter(pk__in=[pk for name, pk in existing.items() if name not in tags]).delete()
            RunTag.objects.bulk_create([RunTag(run=run, name=name) for name in tags
                                        if name not in existing])
            getattr(run, "_prefetched_objects_cache", {}).pop("tags", None)
        if note is not None:
            Run.objects.filter(pk=run.pk).update(note=note)
            run.note = note
        if run.mlflow_run_id:
            transaction.on_commit(lambda: notify_worker("workers.tasks.sync_run_notes", run.pk))
    return run


def create_experiment(project, user, name: str, description: str = "") -> Experiment:
    """A new experiment in `project` (owners and maintainers); its name is unique in the
    project. Its MLflow experiment is made when its first run launches."""
    if not project.can_write(user):
        raise PermissionDenied("Viewers cannot create experiments: ask an owner for the "
                               "maintainer role.")
    if Experiment.objects.filter(project=project, name=name).exists():
        raise RequestError("name", f"{project.name} already has an experiment named {name!r}: "
                                   "choose another name.")
    return Experiment.objects.create(project=project, name=name, description=description,
                                     created_by=user)
