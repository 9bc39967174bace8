"""The policy every Engram API view carries itself, so it holds in any project whatever its
REST_FRAMEWORK settings say: staff only (token or admin session), JSON bodies of bounded size,
strict query parameters, Engram's pagination, error bodies and OpenAPI schema.
"""

from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.openapi import AutoSchema
from rest_framework.permissions import IsAdminUser

from .exceptions import exception_handler
from .filters import StrictOrderingFilter, StrictQueryParameters
from .pagination import MemoryPagination
from .parsers import LimitedJSONParser
from .workspaces import WorkspaceSessionAuthentication, WorkspaceTokenAuthentication


class StaffAPI:
    """Mixed into every API view (before DRF's classes)."""

    # Token first: an anonymous request is answered 401 with a WWW-Authenticate header. Either
    # makes the user's workspace current (memory/api/workspaces.py).
    authentication_classes = [WorkspaceTokenAuthentication, WorkspaceSessionAuthentication]
    permission_classes = [IsAdminUser]
    parser_classes = [LimitedJSONParser]
    # Unknown, blank or unclean parameters: a 400 naming them.
    filter_backends = [StrictQueryParameters, DjangoFilterBackend, StrictOrderingFilter]
    pagination_class = MemoryPagination
    schema = AutoSchema()

    def get_exception_handler(self):
        return exception_handler
