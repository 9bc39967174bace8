"""Exceptions of the memory app."""


class MemoryServiceError(Exception):
    """Base class of every error the memory service raises on purpose."""


class InvalidMemoryArgument(MemoryServiceError, ValueError):
    """An argument is missing or wrong; nothing was written. `field` names the argument."""

    def __init__(self, field, message):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class MemoryNotFound(MemoryServiceError, LookupError):
    """The fact, episode, procedure or user asked for does not exist."""

    def __init__(self, kind, ident):
        self.kind = kind
        self.ident = ident
        super().__init__(f"{kind} {ident!r} does not exist")


class PersonForgotten(MemoryNotFound):
    """The memory user was forgotten (deleted) before this write for them: nothing was written."""

    def __init__(self, ident):
        super().__init__("memory user", ident)
        self.args = (f"memory user {ident} was forgotten; nothing was written for them",)


class MemoryInUse(InvalidMemoryArgument):
    """The rows still hold other memory; `field` names the option that would delete it too. Nothing changed."""


class MemoryConflict(InvalidMemoryArgument):
    """A concurrent change made the request impossible as asked (e.g. the users were merged meanwhile). Nothing changed."""


class LimitReached(InvalidMemoryArgument):
    """A write would take an owner past a limit that refuses rather than evicts; nothing was written.

    `limit` names the setting (e.g. "MAX_FACTS_PER_USER"), `value` is its value, `field` the argument refused.
    """

    def __init__(self, field, message, *, limit, value):
        self.limit = limit
        self.value = value
        super().__init__(field, message)


class ConsolidationFailed(MemoryServiceError):
    """A consolidation run could not process every episode it took; `report` says which and why."""

    def __init__(self, report):
        self.report = report
        problems = [*report.errors, *(f"episode {pk}: {err}" for pk, err in report.failed.items())]
        super().__init__("consolidation failed: " + "; ".join(problems))


class ImportRejected(MemoryServiceError, ValueError):
    """An import file is malformed or conflicts with the database; nothing was written.

    `errors` lists (line, field, message), line 1 being the header.
    """

    def __init__(self, errors):
        self.errors = list(errors)
        line, field, message = self.errors[0]
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        super().__init__(f"line {line}: {field}: {message}{more}")
