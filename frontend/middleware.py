"""A page the user may not see is a plain 404 page, also with DEBUG on (never a trace)."""

from django.http import Http404
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
