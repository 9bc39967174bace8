"""MemoryService: the one place that reads and writes facts, episodes, procedures and memory users.

A facade: each concern lives in its own module, and MemoryService is all of them at once, so
callers (nodes, tools, the admin, the REST API, commands) need one object and one import.

    memory/domain/facts.py       facts: get, set (confirm / update / skip), edit, search, list
    memory/domain/episodes.py    episodes: start, append, complete, record, recent
    memory/domain/users.py       memory users: identities, identify, merges, context
    memory/domain/procedures.py  procedures: save, match a goal, score by use
    memory/recall/service.py  recall (hybrid keyword + vector) and its index upkeep
    memory/operations/operators.py   lists for operators, batch deletes, forget a person, list_memories
    memory/operations/lifecycle.py   consolidation, limits, export / import, clearing, health, counts
    memory/domain/store_items.py  items of LangGraph stores (workflows.store.EngramStore)
    memory/asynchronous.py  aget_fact, aset_fact, arecall, aidentify, ...: the same, awaitable

Shared argument checks are in memory/domain/validation.py, owner keys in memory/domain/owners.py.
"""

from .asynchronous import AsyncMixin
from .backends import get_backend
from .domain.deletions import BatchDelete
from .domain.episodes import EpisodesMixin
from .domain.facts import (
    MAX_FACT_SEARCH_WORDS,
    MAX_SEARCH_LENGTH,
    FactsMixin,
    FactWrite,
    WriteAction,
)
from .domain.procedures import ProceduresMixin
from .domain.store_items import StoreItemsMixin
from .domain.users import Identified, UserContext, UsersMixin
from .operations.lifecycle import LifecycleMixin
from .operations.operators import OperatorsMixin
from .operations.transfer_kinds import NaturalKey, TransferKind
from .operations.transfer_kinds import register_kind as register_transfer_kind
from .recall.service import RecallMixin
from .rules.validation import MAX_ID, Viewer, check_id_list

__all__ = [
    "MAX_FACT_SEARCH_WORDS",
    "MAX_ID",
    "MAX_SEARCH_LENGTH",
    "BatchDelete",
    "FactWrite",
    "Identified",
    "MemoryService",
    "NaturalKey",
    "TransferKind",
    "UserContext",
    "Viewer",
    "WriteAction",
    "check_id_list",
    "register_transfer_kind",
]


class MemoryService(
    FactsMixin,
    EpisodesMixin,
    UsersMixin,
    ProceduresMixin,
    RecallMixin,
    OperatorsMixin,
    LifecycleMixin,
    StoreItemsMixin,
    AsyncMixin,
):
    """Every memory question and write goes through here; see the README for the rules it keeps."""

    def __init__(self):
        self.backend = get_backend()
