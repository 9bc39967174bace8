"""Pagination of the operators' API: pages with the total count, page size settable up to a maximum."""
from rest_framework.pagination import PageNumberPagination

from ..conf import memory_settings


class MemoryPagination(PageNumberPagination):
    """`?page=N&page_size=M`; answers {"count", "next", "previous", "results"}."""

    page_size_query_param = "page_size"

    @property
    def page_size(self):
        return memory_settings.API_PAGE_SIZE

    @property
    def max_page_size(self):
        return memory_settings.API_MAX_PAGE_SIZE
