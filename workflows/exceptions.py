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
    """The Bot API could not be reached or refused a call. The message never contains the token."""


class ChatModelConfigError(WorkflowError, ValueError):
    """WORKFLOWS["CHAT_MODEL"] cannot be turned into a chat model; the message names the key."""
