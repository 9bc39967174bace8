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
from dataclasses import dataclass
from datetime import UTC, date, datetime, time

from django.conf import settings
from django.db import connection, models
from django.utils import timezone

from ..exceptions import InvalidMemoryArgument
from ..models import MemoryUser
from ..models.workspaces import current_workspace_id

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


def check_bool(field_name, value, *, spelled=False):
    """`value` as a bool: JSON true or false; with `spelled` (a query parameter), also the text "true"
    or "false", as OpenAPI spells a boolean parameter (the schema says so: nothing else is accepted).
    The one boolean parser of every entry point."""
    if isinstance(value, bool):
        return value
    if spelled and value in _SPELLED_BOOLS:
        return _SPELLED_BOOLS[value]
    raise InvalidMemoryArgument(field_name, "must be true or false")


_SPELLED_BOOLS = {"true": True, "false": False}


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
            raise _bad(field_name, _field_path(field_name, where), f"is nested deeper than {max_depth} levels")
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


def _field_path(field_name, where):
    """Where a too deep value sits, as a person names it: `where` less its trailing list indices
    (`value[0][0]...[0]` is the field `value`), and at most MAX_PATH_STEPS steps past `field_name`."""
    steps = _PATH_STEPS.findall(where[len(field_name) :])
    while steps and steps[-1].startswith("["):
        steps.pop()
    return field_name + "".join(steps[:MAX_PATH_STEPS]) + ("…" if len(steps) > MAX_PATH_STEPS else "")


_PATH_STEPS = re.compile(r"\.[^.\[]*|\[\d+\]")
MAX_PATH_STEPS = 8
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


def nesting_path(text, field_name, max_depth=MAX_JSON_DEPTH):
    """The field path (as check_json names it) of the first container nested deeper than `max_depth`
    in the JSON `text`, or `field_name`: for a text too deep for Python's recursive parser. Reads
    the text once, iteratively, tracking only the keys and indices of the open containers."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "replace")
    open_ = []  # per open container: ["{", key, expecting a key] or ["[", index, False]
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == '"':
            match = _JSON_STRING.match(text, i)
            if match is None:
                break
            if open_ and open_[-1][0] == "{" and open_[-1][2]:
                try:
                    open_[-1][1] = json.loads(match.group())
                except ValueError:
                    open_[-1][1] = match.group()[1:-1]
            i = match.end()
            continue
        if char in "[{":
            if len(open_) >= max_depth:
                where = field_name + "".join(f".{key}" if kind == "{" else f"[{key}]" for kind, key, _ in open_)
                return _field_path(field_name, where)
            open_.append([char, 0, False] if char == "[" else [char, "", True])
        elif char in "]}" and open_:
            open_.pop()
        elif char == "," and open_:
            if open_[-1][0] == "[":
                open_[-1][1] += 1
            else:
                open_[-1][2] = True
        elif char == ":" and open_:
            open_[-1][2] = False
        i += 1
    return field_name


def top_field(error, default):
    """The top-level key a check_json error's path names ("body.ids[0]" -> "ids"), or `default`."""
    path = getattr(error, "path", error.field)
    head, _, rest = path.partition(".")
    return rest.split(".")[0].split("[")[0] or default if rest else default


def loads(field_name, data, *, max_depth=MAX_JSON_DEPTH):
    """Parse JSON text or bytes and check it (check_json): a hostile body is an InvalidMemoryArgument, never a crash."""
    try:
        value = json.loads(data)
    except RecursionError:  # Python's parser recurses: find where, without recursion
        raise _bad(
            field_name, nesting_path(data, field_name, max_depth), f"is nested deeper than {max_depth} levels"
        ) from None
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


# ---------------------------------------------------------------- the service's arguments

# Ids per statement: well under every database's bound-parameter limit.
ID_CHUNK = 900
# The largest id a BigAutoField holds; a larger one cannot name a row (and would overflow the driver).
MAX_ID = 2**63 - 1

_CHANNEL = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_CHOICE_VALUES = {}


@dataclass(frozen=True)
class Viewer:
    """Who is asking: an agent, the user it talks to, and the session. Each part may be absent.

    A viewer sees global facts, the agent's facts, the user's facts and the session's facts.
    """

    agent_id: str = ""
    user_id: int | None = None
    session_id: str = ""


def make_viewer(agent_id, user_id, session_id):
    """The checked Viewer of these arguments."""
    return Viewer(
        agent_id=clean_text("agent_id", agent_id, required=False, max_length=128),
        user_id=check_user_id("user_id", user_id, required=False),
        session_id=clean_text("session_id", session_id, required=False, max_length=128),
    )


def check_channel(value):
    """A channel name: lower-case letters, digits, '_', '.', '-' (no ':', which joins canonical ids)."""
    channel = clean_text("channel", value, max_length=50).lower()
    if not _CHANNEL.match(channel):
        raise InvalidMemoryArgument("channel", f"must be letters, digits, '_', '.' or '-', got {value!r}")
    return channel


def check_external_id(value):
    """A user's id on a channel: text (an int is taken as its digits), at most 255 characters."""
    return clean_text("external_id", str(value) if isinstance(value, int) else value, max_length=255)


def check_choice(field_name, value, choices):
    """`value` if it is one of the TextChoices `choices`."""
    allowed = _CHOICE_VALUES.get(choices)
    if allowed is None:
        allowed = _CHOICE_VALUES[choices] = frozenset(choices.values)
    if value not in allowed:
        raise InvalidMemoryArgument(field_name, f"must be one of {', '.join(choices.values)}; got {value!r}")
    return value


def check_unit_interval(field_name, value):
    """A number from 0 to 1 (a confidence), as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidMemoryArgument(field_name, f"must be a number from 0 to 1, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise InvalidMemoryArgument(field_name, f"must be from 0 to 1, got {value}")
    return float(value)


def importance_as_confidence(value):
    """A tool's `importance` (0 to 1, optional) as the confidence set_fact stores: recall's ranking
    reads a fact's confidence as its importance. None stays None (the default confidence)."""
    return None if value is None else check_unit_interval("importance", value)


MAX_TAGS = 20
MAX_TAG_LENGTH = 50


def check_tags(field_name, value):
    """A list of at most MAX_TAGS labels, each lower-cased with anything but letters, digits, "-" and
    "_" read as "_" (as the seeds sanitize categories), duplicates dropped, order kept."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise InvalidMemoryArgument(field_name, f"must be a list of strings, got {type(value).__name__}")
    if len(value) > MAX_TAGS:
        raise InvalidMemoryArgument(field_name, f"holds {len(value)} tags; at most {MAX_TAGS}")
    tags = []
    for index, tag in enumerate(value):
        if not isinstance(tag, str):
            raise InvalidMemoryArgument(field_name, f"item {index} must be a string, got {type(tag).__name__}")
        clean = re.sub(r"[^\w-]+", "_", tag.strip().lower(), flags=re.ASCII).strip("_")
        if not clean:
            raise InvalidMemoryArgument(field_name, f"item {index} must hold a letter or digit")
        if len(clean) > MAX_TAG_LENGTH:
            raise InvalidMemoryArgument(field_name, f"item {index} is longer than {MAX_TAG_LENGTH} characters")
        if clean not in tags:
            tags.append(clean)
    return tags


def check_user_id(field_name, value, *, required):
    """A row id (a MemoryUser stands for its id); None when absent and not `required`."""
    if value is None:
        if required:
            raise InvalidMemoryArgument(field_name, "is required")
        return None
    if isinstance(value, MemoryUser):
        return value.pk
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidMemoryArgument(field_name, f"must be a positive integer id, got {value!r}")
    return value


def check_user_in_workspace(field_name, user_id):
    """Refuse a write for `user_id` when a workspace is current and the person is not of it (as an
    unknown id is refused). Costs a query only inside a workspace; unscoped code writes for anyone."""
    workspace_id = current_workspace_id()
    if workspace_id is None:
        return
    # The statement written out (what MemoryUser.objects.filter(pk=...).exists() runs in a workspace):
    # every write of a person's memory asks, and building the queryset cost more than running it.
    with connection.cursor() as cursor:
        cursor.execute(_USER_IN_WORKSPACE, [user_id, workspace_id])
        found = cursor.fetchone() is not None
    if not found:
        raise InvalidMemoryArgument(field_name, f"no memory user with id {user_id}")


_USER_IN_WORKSPACE = f"SELECT 1 FROM {MemoryUser._meta.db_table} WHERE id = %s AND workspace_id = %s"


def check_as_of(field_name, value):
    """A point in time: a datetime, timezone-aware when the project uses aware ones (USE_TZ); or an
    ISO 8601 date or datetime (a string, or a date): one without an offset is read as UTC, a date as
    its midnight UTC. The times of fact history (as_of) and of valid time (valid_at, valid_from,
    valid_to) all take this form, so a REST query, a tool call and a Python caller say the same."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in ("z", "Z") else text)
        except ValueError:
            raise InvalidMemoryArgument(
                field_name, f"must be an ISO 8601 date or datetime (2024-05-01, 2024-05-01T12:00:00Z), got {value!r}"
            ) from None
        if timezone.is_naive(value):
            value = value.replace(tzinfo=UTC)
    elif isinstance(value, date) and not isinstance(value, datetime):
        value = datetime.combine(value, time(), tzinfo=UTC)
    if not isinstance(value, datetime):
        raise InvalidMemoryArgument(field_name, f"must be a datetime, got {type(value).__name__} {value!r}")
    if settings.USE_TZ and timezone.is_naive(value):
        raise InvalidMemoryArgument(field_name, "must be timezone-aware (a datetime with tzinfo), got a naive datetime")
    return check_utc_range(field_name, value)


def check_valid_time(valid_from, valid_to):
    """A fact's valid time: (valid_from, valid_to), each None or a time check_as_of takes, and
    valid_to after valid_from (an interval holding no instant says nothing)."""
    valid_from = None if valid_from is None else check_as_of("valid_from", valid_from)
    valid_to = None if valid_to is None else check_as_of("valid_to", valid_to)
    if valid_from is not None and valid_to is not None and valid_to <= valid_from:
        raise InvalidMemoryArgument(
            "valid_to", f"must be after valid_from ({valid_from.isoformat()}), got {valid_to.isoformat()}"
        )
    return valid_from, valid_to


def check_utc_range(field_name, value):
    """`value` if an aware datetime is still a datetime once taken to UTC, where Django takes it to
    query or store it: 9999-12-31T23:59-14:00 is in year 10000 there, and raised OverflowError from
    deep inside the query on SQLite (PostgreSQL kept it)."""
    if timezone.is_aware(value):
        try:
            value.astimezone(UTC)
        except OverflowError:
            raise InvalidMemoryArgument(
                field_name, f"is out of range: {value.isoformat()} is not between years 1 and 9999 in UTC"
            ) from None
    return value


def check_limit(value, default):
    """A positive integer, or `default` when None."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidMemoryArgument("limit", f"must be a positive integer, got {value!r}")
    return value


def is_row_id(ident):
    return not isinstance(ident, bool) and isinstance(ident, int) and 0 < ident <= MAX_ID


def check_id_list(ids, max_ids=None, *, noun="id", valid=is_row_id, expected=f"a positive integer id up to {MAX_ID}"):
    """A non-empty list of ids, each passing `valid` (duplicates dropped, order kept), at most
    `max_ids`; errors name `ids` or `ids[i]`. Other apps' batch deletes use it with their own ids."""
    if isinstance(ids, (str, bytes, dict)) or not hasattr(ids, "__iter__"):
        raise InvalidMemoryArgument("ids", f"must be a list of {noun}s, got {type(ids).__name__}")
    ids = list(ids)
    if not ids:
        raise InvalidMemoryArgument("ids", f"must name at least one {noun}")
    if max_ids is not None and len(ids) > max_ids:
        raise InvalidMemoryArgument("ids", f"at most {max_ids} ids per call, got {len(ids)}")
    for n, ident in enumerate(ids):
        if not valid(ident):
            raise InvalidMemoryArgument(f"ids[{n}]", f"must be {expected}, got {ident!r}")
    return list(dict.fromkeys(ids))


def chunks(items, size=ID_CHUNK):
    """`items` as lists of at most `size`: one statement's worth of ids."""
    items = list(items)
    for start in range(0, len(items), size):
        yield items[start : start + size]


def problem_of(*checks):
    """(field, message) of the first check (a function raising InvalidMemoryArgument) that fails, or None."""
    for check in checks:
        try:
            check()
        except InvalidMemoryArgument as exc:
            return exc.field, exc.message
    return None


def field_checker(f):
    """A function value -> (clean value, None) or (None, message) for one model field (import's row checks)."""
    nullable = f.null
    choices = {c[0] for c in f.flatchoices} if f.choices else None
    max_length = getattr(f, "max_length", None)

    def done(value, message=None):
        return (None, message) if message else (value, None)

    if isinstance(f, models.DateTimeField):

        def check(v):
            if v is None:
                return done(None, None if nullable else "must be a timestamp, not null")
            if not isinstance(v, str):
                return done(None, "must be an ISO 8601 timestamp string")
            try:
                parsed = datetime.fromisoformat(v)
            except ValueError:
                return done(None, f"is not an ISO 8601 timestamp: {v!r}")
            if parsed.tzinfo is None:
                return done(None, "must carry a UTC offset")
            try:
                return done(check_utc_range("", parsed))
            except InvalidMemoryArgument as exc:
                return done(None, exc.message)
    elif isinstance(f, models.JSONField):

        def check(v):
            if v is None and not nullable:
                return done(None, "must not be null")
            return done(v)
    elif isinstance(f, models.BooleanField):

        def check(v):
            if v is None and nullable:
                return done(None)
            return done(v) if isinstance(v, bool) else done(None, "must be true or false")
    elif isinstance(f, models.FloatField):

        def check(v):
            if v is None and nullable:
                return done(None)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return done(None, "must be a finite number")
            return done(float(v))
    elif isinstance(f, (models.IntegerField, models.AutoField, models.ForeignKey)):
        positive = isinstance(f, (models.PositiveIntegerField, models.AutoField, models.ForeignKey))

        def check(v):
            if v is None:
                return done(None, None if nullable else "must be an integer, not null")
            if isinstance(v, bool) or not isinstance(v, int):
                return done(None, "must be an integer")
            if positive and v < (1 if isinstance(f, (models.AutoField, models.ForeignKey)) else 0):
                return done(None, "must be positive")
            if isinstance(f, models.SmallIntegerField) and not -32768 <= v <= 32767:
                return done(None, "is out of range")
            return done(v)
    else:  # CharField, TextField

        def check(v):
            if v is None and nullable:
                return done(None)
            if not isinstance(v, str):
                return done(None, "must be a string")
            if max_length and len(v) > max_length:
                return done(None, f"must be at most {max_length} characters")
            if choices is not None and v not in choices:
                return done(None, f"must be one of {', '.join(sorted(choices))}; got {v!r}")
            return done(v)

    return check
