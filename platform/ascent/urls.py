"""Top-level URLs: the REST API, its OpenAPI schema and Swagger UI, the admin, the web UI."""

from csp.constants import NONCE
from csp.decorators import csp_update
from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView


def healthz(request):
    return JsonResponse({"status": "ok"})


# Swagger UI runs an inline script and style: the policy of its page allows them by nonce.
api_docs = csp_update({"script-src": [NONCE], "style-src": [NONCE]})(
    SpectacularSwaggerView.as_view(url_name="schema", template_name="frontend/swagger_ui.html"))


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", api_docs, name="swagger-ui"),
    path("api/auth/", include("rest_framework.urls")),
    path("", include("frontend.urls")),
]

handler404 = "frontend.middleware.page_not_found"
