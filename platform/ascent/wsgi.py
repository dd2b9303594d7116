"""WSGI entry point: `gunicorn ascent.wsgi` with platform/ on the Python path."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ascent.settings")
application = get_wsgi_application()
