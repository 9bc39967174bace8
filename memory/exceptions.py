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


class MemoryInUse(InvalidMemoryArgument):
    """The rows still hold other memory; `field` names the option that would delete it too. Nothing changed."""
