"""What every `memory` subcommand shares: its shape, and how people and times are shown and parsed."""

import json

from django.core.management.base import CommandError

from ...exceptions import MemoryServiceError
from ...text import clip

BAND_STYLE = {"green": "green", "yellow": "yellow", "red": "red", "unknown": "dim"}


def short(value, width=60):
    return clip(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), width)


def when(value):
    return value.strftime("%Y-%m-%d %H:%M") if value else ""


class Subcommand:
    """One `memory` subcommand."""

    name = ""
    help = ""

    def add_arguments(self, parser):
        pass

    def handle(self, command, options):
        raise NotImplementedError("Subcommand classes must provide handle(command, options)")


def json_flag(parser):
    parser.add_argument("--json", action="store_true", help="print exactly one JSON object")


def existing_person(service, user_id, where):
    """The surviving memory user of `user_id` (following merges), or a CommandError naming `where`."""
    try:
        return service.resolve_user(user_id).pk
    except MemoryServiceError as exc:
        raise CommandError(f"{where}: {exc}") from None


def person_id(service, given):
    """A memory user id from an id or a canonical id (channel:external id)."""
    if given.isascii() and given.isdigit():
        return int(given)
    channel, sep, external = given.partition(":")
    if not sep:
        raise CommandError(f"{given!r} is neither a memory user id nor a canonical id (channel:external id)")
    found = service.memory_user_list().filter(identities__channel=channel, identities__external_id=external).first()
    if found is None:
        raise CommandError(f"no memory user has the identity {given}")
    return found.pk
