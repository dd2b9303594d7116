"""A page the user may not see is a plain 404 page, also with DEBUG on (never a trace); under
/api/ every 404 and 500 is JSON in the API's error shape, also with DEBUG on."""

import logging

from django.http import Http404, JsonResponse
from django.shortcuts import render

log = logging.getLogger("django.request")


class NotFoundPageMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (response.status_code == 404 and request.path.startswith("/api/")
                and not response.get("Content-Type", "").startswith("application/json")):
            return page_not_found(request)  # DEBUG's page for an address no route matches
        return response

    def process_exception(self, request, exception):
        if request.path.startswith("/api/") and not isinstance(exception, Http404):
            log.error("Internal Server Error: %s", request.path, exc_info=exception,
                      extra={"status_code": 500, "request": request})
            return JsonResponse({"error": "server_error", "detail": "The server failed to "
                                 "answer this request; the failure is in its log."}, status=500)
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
