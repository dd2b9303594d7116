"""Ascent's web UI: server-rendered pages over the same services as the REST API."""
