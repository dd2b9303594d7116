"""The platform's two domain errors, shared by every app (accounts, clusters, experiments) and
turned into answers once: by the REST API (api/errors.py) and the web UI's views."""

from __future__ import annotations


class DomainError(Exception):
    """A request that conflicts with the current state of the domain (HTTP 409)."""


class RequestError(ValueError):
    """Input that is well-formed but does not fit the domain (HTTP 400). `field` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)
