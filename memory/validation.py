"""The one set of input checks every entry point uses: service, REST, webhook, tools, nodes, import.

Each check raises InvalidMemoryArgument naming the field, before anything is written. What they refuse,
and why it must be refused at the edge rather than left to the database or the encoder:

- text with U+0000: PostgreSQL refuses it in text and jsonb (SQLite keeps it), so the same write
  would succeed on one database and fail mid-transaction on the other;
- lone surrogates (U+D800..U+DFFF): they cannot be encoded as UTF-8, so they fail wherever text
  leaves Python (the database driver, a JSON response, the Bot API) — after earlier writes;
- integers outside a signed 64-bit column;
- JSON nested deeper than MAX_JSON_DEPTH (Python's parser and encoder recurse; the depth check
  runs iteratively so that it cannot overflow itself);
- searches of more than MAX_SEARCH_WORDS words (each word is a term of the search expression;
  SQLite refuses expression trees past a depth of 1,000).
"""
import json
import math
import re

from .exceptions import InvalidMemoryArgument

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_JSON_DEPTH = 64
MAX_SEARCH_WORDS = 64


def text_problem(value):
    """Why `value` (a str) cannot be stored, or None: a NUL character or a lone surrogate."""
    if "\x00" in value:
        return "must not contain the NUL character (U+0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains an unpaired surrogate at position {exc.start} (not valid Unicode text)"
    return None


def clean_text(field_name, value, *, required=True, max_length=None):
    """`value` as stripped text; None reads as "". Refuses non-strings, NUL, lone surrogates, over-long text."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InvalidMemoryArgument(field_name, f"must be a string, got {type(value).__name__}")
    problem = text_problem(value)
    if problem:
        raise InvalidMemoryArgument(field_name, problem)
    value = value.strip()
    if required and not value:
        raise InvalidMemoryArgument(field_name, "must not be empty")
    if max_length and len(value) > max_length:
        raise InvalidMemoryArgument(field_name, f"must be at most {max_length} characters")
    return value


def check_int(field_name, value, *, minimum=INT64_MIN, maximum=INT64_MAX):
    """`value` as an int within [minimum, maximum] (a signed 64-bit column by default); bools refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidMemoryArgument(field_name, f"must be an integer, got {type(value).__name__}")
    if not minimum <= value <= maximum:
        raise InvalidMemoryArgument(field_name, f"must be from {minimum} to {maximum}, got {value}")
    return value


def parse_int(field_name, text, *, minimum=INT64_MIN, maximum=INT64_MAX):
    """An integer written in ASCII digits (optional leading '-'), e.g. a query parameter.

    `str.isdigit` and `int()` accept other scripts' digits and superscripts ("²", "٣"); a query
    parameter is ASCII or it is wrong.
    """
    if not isinstance(text, str) or not text.isascii() or not text.lstrip("-").isdigit() or text.count("-") > 1:
        raise InvalidMemoryArgument(field_name, f"must be a whole number, got {text!r}")
    return check_int(field_name, int(text), minimum=minimum, maximum=maximum)


def check_json(field_name, value, *, max_depth=MAX_JSON_DEPTH):
    """`value` if it is JSON that every database stores alike: finite numbers, 64-bit integers, clean text.

    Walks the value without recursion, so a hostile depth is refused rather than overflowing the stack.
    The error names `field_name`; its `path` attribute (and its message) the offending part, such
    as `payload.message` or `body.ids[0]`.
    """
    stack = [(value, 1, field_name)]
    while stack:
        item, depth, where = stack.pop()
        if depth > max_depth:
            raise _bad(field_name, field_name, f"is nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise _bad(field_name, where, f"object keys must be strings, got {type(key).__name__}")
                problem = text_problem(key)
                if problem:
                    raise _bad(field_name, where, f"key {key!r} {problem}")
                stack.append((child, depth + 1, f"{where}.{key}"))
        elif isinstance(item, (list, tuple)):
            stack.extend((child, depth + 1, f"{where}[{i}]") for i, child in enumerate(item))
        elif isinstance(item, str):
            problem = text_problem(item)
            if problem:
                raise _bad(field_name, where, problem)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                raise _bad(field_name, where, "integers must fit in 64 bits")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise _bad(field_name, where, f"numbers must be finite, got {item}")
        else:
            raise _bad(field_name, where, f"must be JSON-serialisable, got {type(item).__name__}")
    return value


def _bad(field_name, path, message):
    error = InvalidMemoryArgument(field_name, message if path == field_name else f"{path}: {message}")
    error.path, error.problem = path, message
    return error


def top_field(error, default):
    """The top-level key a check_json error's path names ("body.ids[0]" -> "ids"), or `default`."""
    path = getattr(error, "path", error.field)
    head, _, rest = path.partition(".")
    return rest.split(".")[0].split("[")[0] or default if rest else default


def loads(field_name, data, *, max_depth=MAX_JSON_DEPTH):
    """Parse JSON text or bytes and check it (check_json): a hostile body is an InvalidMemoryArgument, never a crash."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise InvalidMemoryArgument(field_name, f"is nested deeper than {max_depth} levels") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise InvalidMemoryArgument(field_name, f"is not valid JSON ({exc})") from None
    return check_json(field_name, value, max_depth=max_depth)


def check_search(field_name, query, *, max_words=MAX_SEARCH_WORDS, max_length=1000):
    """A search text: clean, at most `max_length` characters and `max_words` words."""
    query = clean_text(field_name, query, required=False, max_length=max_length)
    words = len(query.split())
    if max_words is not None and words > max_words:
        raise InvalidMemoryArgument(field_name, f"has {words} words; a search takes at most {max_words}")
    return query


def storable(value):
    """`value` with every NUL and lone surrogate in its strings (keys too) replaced by U+FFFD.

    For records of what already happened (a run's conversation and actions, which a model wrote):
    refusing them would lose the record; input at the edge is refused instead (check_json).
    """
    if isinstance(value, str):
        return value if text_problem(value) is None else _REPLACE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable(v) for v in value]
    return value


_REPLACE = re.compile("[\x00\ud800-\udfff]")
