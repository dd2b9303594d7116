"""The REST API under /api/v1/: serializers, views, permissions and the OpenAPI schema."""
