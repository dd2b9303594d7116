"""A page the user may not see is a plain 404 page, also with DEBUG on (never a trace)."""

from django.http import Http404, JsonResponse
from django.shortcuts import render


class NotFoundPageMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, Http404) and not request.path.startswith(("/api/", "/admin/")):
            return not_found(request, str(exception) or "")
        return None


def not_found(request, detail: str = ""):
    return render(request, "frontend/404.html", {"detail": detail}, status=404)


def page_not_found(request, exception=None):
    """handler404 (with DEBUG off): an address nothing answers. API clients get the API's error
    shape, people the 404 page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "not_found", "detail": f"Nothing answers at {request.path}: "
                             "the endpoints are listed at /api/docs/."}, status=404)
    return not_found(request, f"Nothing here at {request.path}.")
