"""Ascent's Django project: settings, URLs, WSGI/ASGI entry points."""
