"""MemoryService: the one place that reads and writes facts, episodes, procedures and memory users.

A facade over concerns, each a class built with the collaborators it names:

    Users(backend)                            memory/domain/users.py
    RecallIndex(backend)                      memory/recall/service.py (embedding after writes, reindexing)
    Facts(backend, users, recall_index)       memory/domain/facts.py
    Episodes(backend, users, recall_index)    memory/domain/episodes.py
    Procedures(backend, recall_index)         memory/domain/procedures.py
    StoreItems(backend, users)                memory/domain/store_items.py
    Operators(backend, users)                 memory/operations/operators.py
    Recall(backend, facts, operators)         memory/recall/service.py
    Lifecycle(service, facts, episodes, users)  memory/operations/lifecycle.py
    Curation(backend)                         memory/domain/curation.py (pins, feedback on episodes)
    Teams(backend)                            memory/domain/teams.py (named groups of agents sharing facts)

MemoryService builds them and hands each public method on to its concern, so callers (nodes, tools,
the admin, the REST API, commands) need one object and one import; `a<name>` runs `<name>` off the
event loop. A concern calls another only through the public methods of the collaborator it was given.
Lifecycle gets the service itself: consolidation, promotion and clearing act through its public calls.
"""

import functools

from .asynchronous import awaitable
from .backends import get_backend
from .domain.curation import Curation
from .domain.deletions import BatchDelete
from .domain.episodes import Episodes
from .domain.facts import MAX_FACT_SEARCH_WORDS, MAX_SEARCH_LENGTH, Facts, FactWrite, WriteAction
from .domain.procedures import Procedures
from .domain.store_items import StoreItems
from .domain.teams import Teams
from .domain.users import Identified, UserContext, Users
from .operations.erasure import register_participant as register_erasure_participant
from .operations.health import register_component as register_health_component
from .operations.lifecycle import Lifecycle
from .operations.metrics import timed_recall
from .operations.operators import Operators
from .operations.transfer_kinds import NaturalKey, TransferKind
from .operations.transfer_kinds import register_kind as register_transfer_kind
from .recall.service import Recall, RecallIndex
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
    "register_erasure_participant",
    "register_health_component",
    "register_transfer_kind",
]


class _delegate:
    """`method` of the concern held in the attribute `concern`, as a method of MemoryService.

    Read from a service, it is the concern's own bound method, kept on the service after the first
    read (as functools.cached_property keeps a value): a wrapper that passed its arguments on cost
    the hottest reads (get_fact, search_facts) a second call each time.
    """

    def __init__(self, concern, method):
        self.concern = concern
        self.method = method
        functools.update_wrapper(self, method)

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, service, owner=None):
        if service is None:
            return self
        bound = self.method.__get__(getattr(service, self.concern))
        service.__dict__[self.name] = bound
        return bound

    def __call__(self, service, *args, **kwargs):  # MemoryService.get_fact(service, ...)
        return self.method(getattr(service, self.concern), *args, **kwargs)


class MemoryService:
    """Every memory question and write goes through here; see the README for the rules it keeps."""

    LIST_KINDS = Operators.LIST_KINDS

    def __init__(self):
        self.backend = backend = get_backend()
        self.users = Users(backend)
        self.recall_index = RecallIndex(backend)
        self.facts = Facts(backend, self.users, self.recall_index)
        self.episodes = Episodes(backend, self.users, self.recall_index)
        self.procedures = Procedures(backend, self.recall_index)
        self.store_items = StoreItems(backend, self.users)
        self.operators = Operators(backend, self.users)
        self.recalls = Recall(backend, self.facts, self.operators)
        self.lifecycle = Lifecycle(self, self.facts, self.episodes, self.users)
        self.curation = Curation(backend)
        self.teams = Teams(backend)

    # ---- facts (memory/domain/facts.py)
    get_fact = _delegate("facts", Facts.get_fact)
    set_fact = _delegate("facts", Facts.set_fact)
    edit_fact = _delegate("facts", Facts.edit_fact)
    search_facts = _delegate("facts", Facts.search_facts)
    list_facts = _delegate("facts", Facts.list_facts)
    user_facts = _delegate("facts", Facts.user_facts)
    delete_fact = _delegate("facts", Facts.delete_fact)
    fact_history = _delegate("facts", Facts.fact_history)
    optimize_search_index = _delegate("facts", Facts.optimize_search_index)
    flush_access_counts = _delegate("facts", Facts.flush_access_counts)

    # ---- teams (memory/domain/teams.py)
    create_team = _delegate("teams", Teams.create_team)
    get_team = _delegate("teams", Teams.get_team)
    list_teams = _delegate("teams", Teams.teams)
    team_list = _delegate("teams", Teams.team_list)
    team_members = _delegate("teams", Teams.team_members)
    set_team_members = _delegate("teams", Teams.set_team_members)
    delete_team = _delegate("teams", Teams.delete_team)
    delete_teams = _delegate("teams", Teams.delete_teams)

    # ---- episodes (memory/domain/episodes.py)
    start_episode = _delegate("episodes", Episodes.start_episode)
    add_message = _delegate("episodes", Episodes.add_message)
    add_action = _delegate("episodes", Episodes.add_action)
    complete_episode = _delegate("episodes", Episodes.complete_episode)
    get_episode = _delegate("episodes", Episodes.get_episode)
    recent_episodes = _delegate("episodes", Episodes.recent_episodes)
    record_episode = _delegate("episodes", Episodes.record_episode)
    mark_episode_failed = _delegate("episodes", Episodes.mark_episode_failed)

    # ---- memory users (memory/domain/users.py)
    get_or_create_user = _delegate("users", Users.get_or_create_user)
    find_user = _delegate("users", Users.find_user)
    resolve_user = _delegate("users", Users.resolve_user)
    link_identity = _delegate("users", Users.link_identity)
    merge_users = _delegate("users", Users.merge_users)
    count_conversation = _delegate("users", Users.count_conversation)
    user_context = _delegate("users", Users.user_context)
    conversation_count = _delegate("users", Users.conversation_count)
    identify = _delegate("users", Users.identify)
    channel_identities = _delegate("users", Users.channel_identities)

    # ---- procedures (memory/domain/procedures.py)
    save_procedure = _delegate("procedures", Procedures.save_procedure)
    get_procedure = _delegate("procedures", Procedures.get_procedure)
    find_procedure = _delegate("procedures", Procedures.find_procedure)
    matching_procedures = _delegate("procedures", Procedures.matching_procedures)
    record_procedure_use = _delegate("procedures", Procedures.record_procedure_use)
    deactivate_procedure = _delegate("procedures", Procedures.deactivate_procedure)
    list_procedures = _delegate("procedures", Procedures.list_procedures)
    latest_procedures = _delegate("procedures", Procedures.latest_procedures)

    # ---- items of LangGraph stores (memory/domain/store_items.py (the LangGraph store: workflows.store.EngramStore))
    store_owner = _delegate("store_items", StoreItems.store_owner)
    store_get_many = _delegate("store_items", StoreItems.store_get_many)
    store_get_one = _delegate("store_items", StoreItems.store_get_one)
    store_put_many = _delegate("store_items", StoreItems.store_put_many)
    store_search = _delegate("store_items", StoreItems.store_search)
    store_namespaces = _delegate("store_items", StoreItems.store_namespaces)
    sweep_store_items = _delegate("store_items", StoreItems.sweep_store_items)
    store_item_list = _delegate("store_items", StoreItems.store_item_list)
    delete_store_items = _delegate("store_items", StoreItems.delete_store_items)

    # ---- recall (memory/recall/service.py)
    recall = timed_recall(_delegate("recalls", Recall.recall))  # observed for GET /metrics
    forget_visible = _delegate("recalls", Recall.forget_visible)
    list_visible = _delegate("recalls", Recall.list_visible)
    memory_relations = _delegate("recalls", Recall.memory_relations)
    recall_mode = _delegate("recalls", Recall.recall_mode)

    # ---- recall's index (memory/recall/service.py)
    flush_recall_log = _delegate("recall_index", RecallIndex.flush_recall_log)
    optimize_recall_index = _delegate("recall_index", RecallIndex.optimize_recall_index)
    wait_for_vectors = _delegate("recall_index", RecallIndex.wait_for_vectors)
    pending_vectors = _delegate("recall_index", RecallIndex.pending_vectors)
    reindex_recall = _delegate("recall_index", RecallIndex.reindex_recall)

    # ---- operators: lists, deletes, forgetting a person, counts (memory/operations/operators.py)
    fact_list = _delegate("operators", Operators.fact_list)
    episode_list = _delegate("operators", Operators.episode_list)
    procedure_list = _delegate("operators", Operators.procedure_list)
    fact_version_list = _delegate("operators", Operators.fact_version_list)
    promotion_list = _delegate("operators", Operators.promotion_list)
    relation_list = _delegate("operators", Operators.relation_list)
    memory_user_list = _delegate("operators", Operators.memory_user_list)
    delete_facts = _delegate("operators", Operators.delete_facts)
    delete_episodes = _delegate("operators", Operators.delete_episodes)
    delete_procedures = _delegate("operators", Operators.delete_procedures)
    delete_users = _delegate("operators", Operators.delete_users)
    hold_person = _delegate("operators", Operators.hold_person)
    was_forgotten = _delegate("operators", Operators.was_forgotten)
    forgotten_sql = _delegate("operators", Operators.forgotten_sql)
    user_footprint = _delegate("operators", Operators.user_footprint)
    record_deletion = _delegate("operators", Operators.record_deletion)
    export_person = _delegate("operators", Operators.export_person)
    list_memories = _delegate("operators", Operators.list_memories)
    memory_counts = _delegate("operators", Operators.memory_counts)

    # ---- memory over time: consolidation, observation, promotion, limits, export and import, clearing, health (memory/operations/lifecycle.py)
    consolidate = _delegate("lifecycle", Lifecycle.consolidate)
    promote = _delegate("lifecycle", Lifecycle.promote)
    observe = _delegate("lifecycle", Lifecycle.observe)
    learn_procedures = _delegate("lifecycle", Lifecycle.learn_procedures)
    compact_episodes = _delegate("lifecycle", Lifecycle.compact_episodes)
    consolidate_after_run = _delegate("lifecycle", Lifecycle.consolidate_after_run)
    unconsolidated_episodes = _delegate("lifecycle", Lifecycle.unconsolidated_episodes)
    store_consolidated_facts = _delegate("lifecycle", Lifecycle.store_consolidated_facts)
    record_consolidation_run = _delegate("lifecycle", Lifecycle.record_consolidation_run)
    last_consolidation = _delegate("lifecycle", Lifecycle.last_consolidation)
    prune = _delegate("lifecycle", Lifecycle.prune)
    once_per_period = _delegate("lifecycle", Lifecycle.once_per_period)
    export_memories = _delegate("lifecycle", Lifecycle.export_memories)
    import_memories = _delegate("lifecycle", Lifecycle.import_memories)
    clear_memories = _delegate("lifecycle", Lifecycle.clear_memories)
    memory_health = _delegate("lifecycle", Lifecycle.memory_health)
    snapshot_health = _delegate("lifecycle", Lifecycle.snapshot_health)
    health_snapshots = _delegate("lifecycle", Lifecycle.health_snapshots)

    # ---- what operators curate: pins, feedback on episodes (memory/domain/curation.py)
    pin_memories = _delegate("curation", Curation.pin_memories)
    pinned_memories = _delegate("curation", Curation.pinned_memories)
    episode_feedback = _delegate("curation", Curation.episode_feedback)

    # ---- awaitable: the calls nodes, tools and the LangGraph store make (memory/asynchronous.py)
    aget_fact = awaitable("get_fact")
    aset_fact = awaitable("set_fact")
    asearch_facts = awaitable("search_facts")
    alist_facts = awaitable("list_facts")
    adelete_facts = awaitable("delete_facts")
    arecall = awaitable("recall")
    aobserve = awaitable("observe")
    aidentify = awaitable("identify")
    aget_or_create_user = awaitable("get_or_create_user")
    aresolve_user = awaitable("resolve_user")
    arecord_episode = awaitable("record_episode")
    auser_context = awaitable("user_context")
    astore_get_many = awaitable("store_get_many")
    astore_put_many = awaitable("store_put_many")
    astore_search = awaitable("store_search")
    astore_namespaces = awaitable("store_namespaces")
