"""Pagination: page numbers for small collections, cursors for runs (stable while runs arrive).

`page_size` is an integer from 1 to MAX_PAGE_SIZE, or a 400 naming it (DRF would quietly fall
back to the default page for `page_size=x` and cut a larger one down): what the OpenAPI document
says is what the server does."""

from rest_framework import pagination
from rest_framework.exceptions import ValidationError

MAX_PAGE_SIZE = 500


class _StrictPageSize:
    page_size_query_param = "page_size"
    max_page_size = MAX_PAGE_SIZE

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= self.max_page_size:
            raise ValidationError({self.page_size_query_param: [
                f"must be a whole number from 1 to {self.max_page_size}, got {raw[:40]!r}"]})
        return int(raw)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1,
                                       "maximum": self.max_page_size}
        return parameters


class PageNumberPagination(_StrictPageSize, pagination.PageNumberPagination):
    pass


class RunCursorPagination(_StrictPageSize, pagination.CursorPagination):
    """Newest first (the audit log's pagination is this one, ordered by its own fields)."""

    ordering = "-created_at"
