"""ASGI entry point for live log streams in production: server-sent events served without a
thread each (the proxy routes them here; ascent.wsgi serves the rest):
`gunicorn ascent.asgi:application -k uvicorn_worker.UvicornWorker` with platform/ and the
repository root on the Python path (docs/operations.md)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ascent.settings")
application = get_asgi_application()
