"""Request-level guards that run before any view: body size and how the body is framed."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import JsonResponse


def _error(status: int, code: str, detail: str, field: str | None = None) -> JsonResponse:
    body = {"error": code, "detail": detail}
    if field is not None:
        body["errors"] = [{"field": field, "message": detail}]
    return JsonResponse(body, status=status)


class BodySizeLimitMiddleware:
    """Answer 413 to a body over ASCENT_MAX_BODY_BYTES, 400 to a bad Content-Length, and 411 to
    a chunked body without Content-Length under WSGI (Django would read it as empty).

    Under WSGI the declared length is checked before anything is read. Under ASGI the server has
    already received the whole body (chunked or not) into a spooled file, so its real size is
    checked instead.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.refusal(request) or self.get_response(request)

    def refusal(self, request) -> JsonResponse | None:
        raw = request.META.get("CONTENT_LENGTH") or ""
        if raw and not raw.strip().isdigit():
            return _error(400, "invalid", "Content-Length is not a number of bytes.", "Content-Length")
        if isinstance(request, ASGIRequest):
            length = _spooled_size(request._stream)
            if not raw and length:  # chunked: DRF reads no body without a length, so give it one
                request.META["CONTENT_LENGTH"] = str(length)
        elif not raw and "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
            return _error(411, "length_required", "Chunked request bodies are not read: send the "
                          "body with a Content-Length header.")
        else:
            length = int(raw or 0)
        limit = settings.ASCENT_MAX_BODY_BYTES
        if length > limit:
            return _error(413, "payload_too_large", f"Request body of {length} bytes exceeds the "
                          f"limit of {limit} bytes (ASCENT_MAX_BODY_BYTES): send a smaller body.")
        return None


def _spooled_size(stream) -> int:
    """Bytes in the body file an ASGI server has already received, leaving it at the start."""
    position = stream.tell()
    size = stream.seek(0, os.SEEK_END)
    stream.seek(position)
    return size
