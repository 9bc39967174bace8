"""Errors of the operators' API: memory service errors become 400/404 answers that name the field."""

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ..exceptions import (
    InvalidMemoryArgument,
    MemoryConflict,
    MemoryInUse,
    MemoryNotFound,
)


def exception_handler(exc, context):
    """DRF's handler, plus InvalidMemoryArgument → 400 {field: [message]}, MemoryInUse and MemoryConflict → 409, MemoryNotFound → 404."""
    if isinstance(exc, (MemoryInUse, MemoryConflict)):
        return Response({exc.field: [exc.message]}, status=status.HTTP_409_CONFLICT)
    if isinstance(exc, InvalidMemoryArgument):
        return Response({exc.field: [exc.message]}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, MemoryNotFound):
        return Response({"detail": str(exc)}, status=status.HTTP_404_NOT_FOUND)
    return drf_exception_handler(exc, context)
