"""WSGI entry point for every request but live log streams (those go to ascent.asgi):
`gunicorn ascent.wsgi -k gthread` with platform/ on the Python path (docs/operations.md)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ascent.settings")
application = get_wsgi_application()
