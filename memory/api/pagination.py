"""Pagination of the operators' API: pages with the total count, page size settable up to a maximum.

Every paginated endpoint (both apps' lists) uses this one class. A `page` or `page_size` that is not
one positive integer in ASCII digits, or a `page_size` over the maximum, is a 400 naming it (and the
maximum): never served as something else. A page past the last one is a 404 (DRF's "Invalid page").
"""

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
        """The asked page size; a malformed one, or one over the maximum, is a 400 (never capped silently:
        a client asking for 501 rows and given 500 would take the page for the whole list)."""
        raw = _positive_integer(request, self.page_size_query_param)
        if raw is None:
            return self.page_size
        if int(raw) > self.max_page_size:
            raise ValidationError({self.page_size_query_param: [f"Must be at most {self.max_page_size}."]})
        return int(raw)

    def get_page_number(self, request, paginator):
        """The asked page: one positive integer (or "last"); anything else is a 400 naming `page`.

        DRF would serve page 1 for `?page=`, and answer 404 "Invalid page" for `?page=²`.
        """
        raw = _positive_integer(request, self.page_query_param, also=self.last_page_strings)
        if raw in self.last_page_strings:
            return paginator.num_pages
        return 1 if raw is None else raw

    def get_schema_operation_parameters(self, view):
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            parameter["schema"]["minimum"] = 1
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"]["maximum"] = self.max_page_size
        return parameters


def _positive_integer(request, name, also=()):
    """The parameter's one value when it is a positive integer in ASCII digits (or one of `also`),
    None when it is absent; otherwise a 400 naming it. str.isdigit() and int() also accept "²", "٣"
    and other scripts' digits, which no client means as a page."""
    values = request.query_params.getlist(name)
    if not values:
        return None
    if len(values) > 1:
        raise ValidationError({name: ["Give this parameter once."]})
    value = values[0]
    if value in also:
        return value
    if value == "":
        raise ValidationError({name: ["May not be blank."]})
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise ValidationError({name: ["Must be a positive integer."]})
    return value
