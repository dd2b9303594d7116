"""Pagination: page numbers for small collections, cursors for runs (stable while runs arrive)."""

from rest_framework import pagination


class PageNumberPagination(pagination.PageNumberPagination):
    page_size_query_param = "page_size"
    max_page_size = 500


class RunCursorPagination(pagination.CursorPagination):
    ordering = "-created_at"
    page_size_query_param = "page_size"
    max_page_size = 500
