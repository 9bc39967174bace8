"""Models of the memory: facts, episodes, procedures, memory users and their channel identities
(memories), recall's tables (recall) and records about the memory (records).

Read and write them through `memory.service.MemoryService`; nothing else should touch these tables.
"""

from .memories import (
    FACT_HISTORY_VIEW,
    PENDING_VECTOR,
    ChannelIdentity,
    Episode,
    Fact,
    FactAction,
    FactHistory,
    FactType,
    FactVersion,
    MemoryUser,
    Procedure,
    ProcedureSource,
    ProcedureType,
    StoreItem,
    episode_gist,
    holds,
    holds_now,
)
from .owners import SCOPE_RANK, Scope
from .recall import (
    EmbeddingModelRecord,
    MemoryRelation,
    Promotion,
    RecallDocument,
    RecallEvent,
    RecallKind,
    RecallScope,
    Relation,
)
from .records import (
    ArchivedEpisode,
    ConsolidationRun,
    DeletionKind,
    DeletionRecord,
    EmbeddingClaim,
    HealthSnapshot,
    PeriodicRun,
    Tombstone,
)

__all__ = [
    "ArchivedEpisode",
    "ChannelIdentity",
    "ConsolidationRun",
    "DeletionKind",
    "DeletionRecord",
    "HealthSnapshot",
    "EmbeddingClaim",
    "EmbeddingModelRecord",
    "Episode",
    "FACT_HISTORY_VIEW",
    "Fact",
    "FactAction",
    "FactHistory",
    "FactType",
    "FactVersion",
    "MemoryRelation",
    "MemoryUser",
    "PENDING_VECTOR",
    "PeriodicRun",
    "Procedure",
    "ProcedureSource",
    "ProcedureType",
    "Promotion",
    "RecallDocument",
    "RecallEvent",
    "RecallKind",
    "RecallScope",
    "Relation",
    "SCOPE_RANK",
    "Scope",
    "StoreItem",
    "Tombstone",
    "episode_gist",
    "holds",
    "holds_now",
]
