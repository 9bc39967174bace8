"""Request parsing of the operators' API: JSON only, with a limit on the body size and on nesting."""

from rest_framework import exceptions, parsers, status

from ..conf import memory_settings
from ..exceptions import InvalidMemoryArgument
from ..rules import validation


class RequestBodyTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "Request body too large."
    default_code = "request_too_large"


class LimitedJSONParser(parsers.JSONParser):
    """JSONParser that refuses bodies over MEMORY["API_MAX_BODY_BYTES"] before parsing them.

    DRF reads the request stream itself, past Django's DATA_UPLOAD_MAX_MEMORY_SIZE check, so the
    limit is enforced here: by the declared Content-Length, and by reading at most limit + 1 bytes.
    The body then goes through memory.domain.validation.loads: JSON nested past its depth (which would
    overflow Python's recursive parser), NUL characters, lone surrogates and integers past 64 bits
    are a 400 naming the field they are in (its top-level key, and its path in the message), or the
    body, before any view sees them.
    """

    def parse(self, stream, media_type=None, parser_context=None):
        limit = memory_settings.API_MAX_BODY_BYTES
        request = (parser_context or {}).get("request")
        too_large = RequestBodyTooLarge(f"Request body exceeds {limit} bytes.")
        if request is not None:
            try:
                declared = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                declared = 0
            if declared > limit:
                raise too_large
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise too_large
        try:
            return validation.loads("body", body)
        except InvalidMemoryArgument as exc:  # named by the top-level key it is under, as views name fields
            path = getattr(exc, "path", "body")
            # The message names the field's path in the body ("facts[3].value: ..."), not the body.
            message = f"{path.removeprefix('body.')}: {exc.problem}" if path != "body" else exc.message
            raise exceptions.ValidationError({validation.top_field(exc, "body"): [message]}) from None
