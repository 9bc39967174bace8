"""Exceptions of the workflows app."""

from django.core.exceptions import ValidationError


class WorkflowError(Exception):
    """Base class of every error the workflows app raises on purpose."""


class InvalidDefinition(WorkflowError, ValidationError):
    """A workflow definition does not hold together.

    It carries where: `node` (the node id at fault), `edge` (the index of the edge in the definition's
    edges) and `field` (a dotted path inside that node, edge or the definition: "config.limit",
    "position.x", "target", "layout.viewport.zoom"), each None when it does not apply, so a builder can
    mark the spot without parsing the message.
    """

    def __init__(self, message, *, node=None, edge=None, field=None):
        self.node, self.edge, self.field = node, edge, field
        self.message = message
        text = f'node "{node}": {message}' if node else message
        WorkflowError.__init__(self, text)
        ValidationError.__init__(self, {"definition": [text]})
        self.text = text

    def __str__(self):
        return self.text

    def located(self, **where):
        """The same error with more of its location filled in (what the caller knows and it did not)."""
        known = {"node": self.node, "edge": self.edge, "field": self.field}
        known.update({k: v for k, v in where.items() if known.get(k) is None})
        return InvalidDefinition(self.message, **known)

    def as_dict(self):
        return {"node": self.node, "edge": self.edge, "field": self.field, "message": self.message}


class InvalidTrigger(WorkflowError, ValueError):
    """A run's trigger payload is missing something or wrong; `field` names it. Nothing ran."""

    def __init__(self, field, message):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


class TelegramError(WorkflowError):
    """The Bot API could not be reached or refused a call. The message never contains the token.

    `status_code` is the Bot API's HTTP status, None when no answer came (refused, timed out).
    """

    def __init__(self, message, *, status_code=None):
        super().__init__(message)
        self.status_code = status_code

    @property
    def permanent(self):
        """The Bot API refused this call for good (400: bad request, chat not found; 403: blocked by the user)."""
        return self.status_code in (400, 403)


class ChatModelConfigError(WorkflowError, ValueError):
    """WORKFLOWS["CHAT_MODEL"] cannot be turned into a chat model; the message names the key."""
