"""OpenAPI schema of the API (drf-spectacular): the error answers every operation can give."""

_DETAIL = {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]}
# Validation errors name the field: {"ids": ["..."]}, {"ids": {"3": ["..."]}}, {"cascade": ["..."]}.
_FIELD_ERRORS = {"type": "object", "additionalProperties": {}}

_ERRORS = {
    "400": ("Invalid input; the body names each field that was wrong. Nothing was changed.", _FIELD_ERRORS),
    "401": ("No credentials (token or session) were given.", _DETAIL),
    "403": ("Not staff, or a session request without its CSRF token.", _DETAIL),
    "404": ("No such row, or no such page.", _DETAIL),
}
_IN_USE = ("The users still hold memories and cascade was not asked for; nothing was deleted.", _FIELD_ERRORS)
_BODY_ERRORS = {
    "413": ("Request body too large.", _DETAIL),
    "415": ("Only application/json bodies are accepted.", _DETAIL),
}


def add_error_responses(result, generator, request, public):
    """POSTPROCESSING_HOOKS entry: document 400/401/403/404 everywhere, 413/415 where a body is read."""
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            errors = dict(_ERRORS)
            if "requestBody" in operation:
                errors.update(_BODY_ERRORS)
            if path.startswith("/api/v1/memory-users/") and method in {"delete", "post"}:
                errors["409"] = _IN_USE
            responses = operation.setdefault("responses", {})
            for code, (description, schema) in errors.items():
                responses.setdefault(
                    code, {"description": description, "content": {"application/json": {"schema": schema}}}
                )
    return result
