"""Exceptions of the workflows app."""

from django.core.exceptions import ValidationError


class WorkflowError(Exception):
    """Base class of every error the workflows app raises on purpose."""


class InvalidDefinition(WorkflowError, ValidationError):
    """A workflow definition does not hold together; `node` names the node at fault (or None)."""

    def __init__(self, message, *, node=None):
        self.node = node
        text = f'node "{node}": {message}' if node else message
        WorkflowError.__init__(self, text)
        ValidationError.__init__(self, {"definition": [text]})
        self.text = text

    def __str__(self):
        return self.text


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
