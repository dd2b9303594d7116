"""Celery tasks: thin shims around workers.dispatch (the domain services).

Periodic (beat): schedule_runs, watch_runs, reconcile_runs, probe_clusters, purge_audit_log,
deliver_notifications, find_stalled_runs. On demand: the API queues schedule_runs after a submit,
register_model_version after a model version is asked for,
stop_run after a cancel, sync_run_notes after a change of a run's tags or note and
deliver_notifications after an event worth telling, by name
(`ascent.celery.send`), so the web process imports none of this.
"""

from __future__ import annotations

from ascent.celery import app


@app.task(name="workers.tasks.schedule_runs")
def schedule_runs() -> list[int]:
    from workers import dispatch

    placed = dispatch.schedule()
    for run_id in placed:
        launch_run.delay(run_id)
    return placed


@app.task(name="workers.tasks.launch_run")
def launch_run(run_id: int) -> str | None:
    from workers import dispatch

    return dispatch.launch(run_id)


@app.task(name="workers.tasks.watch_runs")
def watch_runs() -> list[int]:
    from workers import dispatch

    relaunch = dispatch.watch_all()
    for run_id in relaunch:
        launch_run.delay(run_id)
    return relaunch


@app.task(name="workers.tasks.stop_run")
def stop_run(run_id: int) -> None:
    from workers import dispatch

    dispatch.stop(run_id)


@app.task(name="workers.tasks.sync_run_notes", autoretry_for=(Exception,), retry_backoff=5,
          max_retries=5)
def sync_run_notes(run_id: int) -> None:
    from workers import dispatch

    dispatch.sync_notes(run_id)


@app.task(name="workers.tasks.reconcile_runs")
def reconcile_runs() -> list[int]:
    from workers import dispatch

    relaunch = dispatch.reconcile()
    for run_id in relaunch:
        launch_run.delay(run_id)
    return relaunch


@app.task(name="workers.tasks.probe_clusters")
def probe_clusters() -> None:
    from clusters.models import Cluster

    for cluster_id in Cluster.objects.values_list("pk", flat=True):
        probe_cluster.delay(cluster_id)


@app.task(name="workers.tasks.probe_cluster")
def probe_cluster(cluster_id: int) -> None:
    from workers import dispatch

    dispatch.probe(cluster_id)


@app.task(name="workers.tasks.purge_audit_log")
def purge_audit_log() -> int:
    from audit import services

    return services.purge_expired()


@app.task(name="workers.tasks.deliver_notifications")
def deliver_notifications() -> list[int]:
    from notifications import services

    return services.deliver_due()


@app.task(name="workers.tasks.find_stalled_runs")
def find_stalled_runs() -> int:
    from notifications import services

    return services.find_stalls()


@app.task(name="workers.tasks.register_model_version", acks_late=True)
def register_model_version(version_id: int) -> str:
    from registry import services

    return services.export_and_register(version_id)
