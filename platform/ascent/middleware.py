"""Request-level guards that run before any view."""

from django.conf import settings
from django.http import JsonResponse


class BodySizeLimitMiddleware:
    """Answer 413 to a request whose declared body exceeds ASCENT_MAX_BODY_BYTES, unread."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        limit = settings.ASCENT_MAX_BODY_BYTES
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return JsonResponse(
                {"error": "bad_request", "detail": "Content-Length is not a number."}, status=400
            )
        if length > limit:
            return JsonResponse(
                {
                    "error": "payload_too_large",
                    "detail": f"Request body of {length} bytes exceeds the limit of {limit} bytes "
                    "(ASCENT_MAX_BODY_BYTES).",
                },
                status=413,
            )
        return self.get_response(request)
