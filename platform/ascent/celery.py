"""The Celery app of the worker (`celery -A ascent worker --beat`); tasks live in workers/tasks.py."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ascent.settings")

app = Celery("ascent")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.imports = ("workers.tasks",)


def send(task: str, *args, **kwargs) -> None:
    """Queue a worker task by name (the web process never imports the worker's modules)."""
    app.send_task(task, args=args, kwargs=kwargs)
