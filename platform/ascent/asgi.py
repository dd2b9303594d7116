"""ASGI entry point of the web service in production, where run logs stream as server-sent
events without a thread each: `gunicorn ascent.asgi:application -k uvicorn_worker.UvicornWorker`
with platform/ and the repository root on the Python path (docs/operations.md)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ascent.settings")
application = get_asgi_application()
