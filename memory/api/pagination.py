"""Pagination of the operators' API: pages with the total count, page size settable up to a maximum."""

from rest_framework.exceptions import ValidationError
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

    def get_page_size(self, request):
        """The asked page size (capped at the maximum); a malformed one is a 400, not silently ignored."""
        raw = request.query_params.getlist(self.page_size_query_param)
        if not raw:
            return self.page_size
        # ASCII digits only: str.isdigit() also accepts "²" and other scripts' digits, which int() refuses.
        if len(raw) > 1 or not (raw[0].isascii() and raw[0].isdigit()) or int(raw[0]) < 1:
            raise ValidationError({self.page_size_query_param: ["Must be one positive integer."]})
        return min(int(raw[0]), self.max_page_size)

    def get_page_number(self, request, paginator):
        """The asked page; `?page=` with nothing is a 400 (DRF would serve page 1), anything else not a page a 404."""
        if request.query_params.get(self.page_query_param) == "":
            raise ValidationError({self.page_query_param: ["May not be blank."]})
        return super().get_page_number(request, paginator)

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
        return parameters
