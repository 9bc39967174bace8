"""Limits and pruning: keep each owner's facts and each agent's episodes and procedures within LIMITS.

Internal to the memory service: call `MemoryService.prune()` (the `memory prune` command); the
service's writes call `enforce_after_create()` when they add a row.

Limits (MEMORY["LIMITS"], None = no limit), overridable per agent in LIMITS["PER_AGENT"]:
- MAX_FACTS per owner: each agent's own facts (the agent's override applies), each user's, each
  session's, and the global ones;
- MAX_EPISODES per agent (episodes without an agent count together);
- MAX_PROCEDURES per agent (shared procedures, agent "", count together);
- MAX_VERSIONS_PER_FACT per fact (fact history; an agent's override applies to its own facts).

What goes first (the row just written is never evicted by its own write):
- facts: the lowest confidence tier first (tiers of 0.1: a confirmed, confident fact outlives every
  doubtful one), then the one unused longest (last recalled, else last written), then the one
  confirmed least, then the oldest;
- episodes: already consolidated ones before unconsolidated ones (those still hold facts not yet
  distilled), each oldest first;
- procedures: inactive before active, then the lowest smoothed success rate (successes + 1) /
  (uses + 2), then the one unused longest, then the oldest;
- fact versions: the oldest (by valid_from) first.

After a prune that deleted rows, SQLite gives free pages back with `PRAGMA incremental_vacuum`
(the file's auto_vacuum mode is INCREMENTAL; see migration 0004). Other apps join a prune through
the `prune_requested` signal (conversation threads and checkpoints). A full prune also deletes recall
events older than PROMOTION["RECALL_EVENT_RETENTION_DAYS"].
"""

from dataclasses import dataclass, field
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, F, FloatField
from django.db.models.functions import Cast, Coalesce, Floor
from django.utils import timezone

from ..backends import get_backend
from ..conf import memory_settings
from ..exceptions import LimitReached
from ..models import Episode, Fact, FactHistory, FactVersion, Procedure, RecallEvent, Scope, StoreItem
from ..models.owners import fact_owner_key, owner_key
from ..models.workspaces import Workspace, current_workspace_id, in_workspace
from ..recall.access import access_counter
from ..signals import prune_requested
from .history import record_deleted

FACTS, EPISODES, PROCEDURES, VERSIONS = "facts", "episodes", "procedures", "fact_versions"
STORE_ITEMS = "store_items"
_SETTING = {
    FACTS: "MAX_FACTS",
    EPISODES: "MAX_EPISODES",
    PROCEDURES: "MAX_PROCEDURES",
    VERSIONS: "MAX_VERSIONS_PER_FACT",
    STORE_ITEMS: "MAX_STORE_ITEMS",
}
_CHUNK = 500


@dataclass
class PruneReport:
    """Rows deleted per kind (or, on a dry run, that would be) and SQLite pages given back."""

    dry_run: bool = False
    deleted: dict[str, int] = field(default_factory=dict)
    reclaimed_pages: int | None = 0  # None: SQLite reclaims them when the caller's transaction commits

    @property
    def total(self):
        return sum(self.deleted.values())

    def as_dict(self):
        return {"dry_run": self.dry_run, "deleted": dict(self.deleted), "reclaimed_pages": self.reclaimed_pages}


def limit_for(kind, agent_id=""):
    """The limit of one kind for an agent ("" and non-agent owners: the default); None: unlimited."""
    limits = memory_settings.LIMITS
    override = (limits["PER_AGENT"] or {}).get(agent_id, {}) if agent_id else {}
    value = override.get(_SETTING[kind], limits[_SETTING[kind]])
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(
            f"MEMORY['LIMITS'] {_SETTING[kind]} for agent {agent_id!r} must be a non-negative integer or None"
        )
    return value


def _fact_limit(scope_key):
    scope, _, owner = scope_key.partition(":")
    return limit_for(FACTS, owner if scope == Scope.AGENT else "")


def _fact_eviction():
    last_used = Coalesce("last_accessed", "updated_at")
    return [Floor(F("confidence") * 10.0).asc(), last_used.asc(), F("times_confirmed").asc(), F("id").asc()]


def _episode_eviction():
    return [F("processed_for_facts").desc(), F("started_at").asc(), F("id").asc()]


def _procedure_eviction():
    smoothed = (Cast(F("times_succeeded"), FloatField()) + 1.0) / (Cast(F("times_used"), FloatField()) + 2.0)
    return [F("is_active").asc(), smoothed.asc(), Coalesce("last_used", "created_at").asc(), F("id").asc()]


def _group(kind, key):
    """Queryset of one group (an owner's facts, an agent's episodes or procedures, a store namespace's
    items) and its eviction order."""
    if kind == FACTS:
        return Fact.objects.filter(scope_key=key), _fact_eviction()
    if kind == STORE_ITEMS:  # the least recently written first
        return StoreItem.objects.filter(namespace=key), [F("updated_at").asc(), F("id").asc()]
    model = Episode if kind == EPISODES else Procedure
    order = _episode_eviction() if kind == EPISODES else _procedure_eviction()
    return model.objects.filter(agent_id=key), order


def prune_group(kind, key, limit, *, keep_id=None, dry_run=False, count=None):
    """Delete the rows of one group beyond `limit`, in eviction order; returns how many (would) go."""
    qs, order = _group(kind, key)
    if count is None:
        count = qs.count()
    excess = count - limit
    if excess <= 0:
        return 0
    if dry_run:
        return excess
    if kind == FACTS:
        access_counter.flush()  # recency must include recalls still buffered
    candidates = qs.exclude(pk=keep_id) if keep_id is not None else qs
    doomed = list(candidates.order_by(*order).values_list("pk", flat=True)[:excess])
    model = qs.model
    with transaction.atomic():
        if kind == FACTS:
            record_deleted(doomed)
        for start in range(0, len(doomed), _CHUNK):
            model.objects.filter(pk__in=doomed[start : start + _CHUNK]).delete()
    return len(doomed)


def enforce_after_create(kind, row):
    """After a write added `row`: if its group crossed its limit, evict down to it (never `row`). Returns rows deleted.

    No limit, no query; otherwise one COUNT, and the deletes only when the limit is crossed.
    """
    if kind == FACTS:
        key = _scope_key(row)
        limit = _fact_limit(key)
    else:
        key, limit = row.agent_id, limit_for(kind, row.agent_id)
    return _evict_over_limit(kind, key, limit, keep_id=row.pk)


def refuse_past_user_cap(fact):
    """After a write created `fact`: if it is a person's fact beyond MAX_FACTS_PER_USER, raise LimitReached
    (the caller's transaction then undoes the insert). No limit or another scope, no query; otherwise one COUNT.

    Concurrent writes of one person on PostgreSQL do not wait for each other (see hold_user), so the cap
    may be passed by the writes in flight at that moment, never by more.
    """
    limit = memory_settings.LIMITS["MAX_FACTS_PER_USER"]
    if fact.scope != Scope.USER or limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError("MEMORY['LIMITS'] MAX_FACTS_PER_USER must be a non-negative integer or None")
    # Through the backend's own SQL: this runs on every new fact of a person, and building the
    # queryset cost more than the statement.
    owned = get_backend().count_owned_facts(_scope_key(fact), limit + 1)
    if owned > limit:
        raise LimitReached(
            "key",
            f"this person already has {limit} facts, the limit (MEMORY['LIMITS']['MAX_FACTS_PER_USER']); "
            f"{fact.key!r} was not stored. Update or delete their facts, or raise the limit",
            limit="MAX_FACTS_PER_USER",
            value=limit,
        )


def enforce_store_items(namespaces):
    """After a store write: each of these namespaces ({joined namespace: owning agent id or ""}) that
    crossed MAX_STORE_ITEMS loses its least recently written items. No limit, no query; otherwise one
    COUNT per namespace written. Returns items deleted."""
    return sum(
        _evict_over_limit(STORE_ITEMS, namespace, limit_for(STORE_ITEMS, agent_id))
        for namespace, agent_id in namespaces.items()
    )


def _evict_over_limit(kind, key, limit, *, keep_id=None):
    """Evict one group down to `limit` (None: no limit, no query) if a write took it past it."""
    if limit is None:
        return 0
    qs, _ = _group(kind, key)
    # Counting past limit + 1 tells nothing more; on a big group this stops early.
    if qs.order_by()[: limit + 1].count() <= limit:
        return 0
    return prune_group(kind, key, limit, keep_id=keep_id, count=qs.count())


def enforce_versions(fact):
    """After a write added a version of `fact`: keep its latest MAX_VERSIONS_PER_FACT. Returns versions deleted.

    A fact has at most 1 + times_confirmed + times_contradicted versions from the service's writes
    (each write bumps one counter, the first creates it), so until the counters pass the limit this
    costs no query; only then one DELETE. Versions the counters do not count (an operator's edits,
    deleted facts) are trimmed by the `memory prune` sweep (prune_all) and by edit_fact itself.
    """
    limit = limit_for(VERSIONS, fact.agent_id)
    if limit is None or 1 + fact.times_confirmed + fact.times_contradicted <= limit:
        return 0
    return trim_versions(fact.pk, limit)


def trim_versions(fact_id, limit, *, dry_run=False):
    """Delete the versions of one fact beyond its latest `limit` (its current one counts), in one
    statement; returns how many (would) go."""
    versions = FactHistory.objects.filter(fact_id=fact_id)
    if dry_run:
        return max(0, versions.count() - limit)
    keep = versions.order_by("-valid_from", "-id").values("pk")[:limit]
    return FactVersion.objects.filter(fact_id=fact_id).exclude(pk__in=keep).delete()[0]


def _versions_over_limit(agent_id):
    """(fact_id, limit) of every fact (deleted ones included) with more versions than its limit."""
    limits = memory_settings.LIMITS
    per_agent = [
        o["MAX_VERSIONS_PER_FACT"] for o in (limits["PER_AGENT"] or {}).values() if "MAX_VERSIONS_PER_FACT" in o
    ]
    known = [v for v in [limits["MAX_VERSIONS_PER_FACT"], *per_agent] if v is not None]
    if not known:
        return []
    qs = FactHistory.objects.order_by().values("fact_id", "agent_id").annotate(n=Count("id"))
    if agent_id is not None:
        qs = qs.filter(scope=Scope.AGENT, agent_id=agent_id)
    over = []
    for row in qs.filter(n__gt=min(known)):
        limit = limit_for(VERSIONS, row["agent_id"])
        if limit is not None and row["n"] > limit:
            over.append((row["fact_id"], limit))
    return over


def _scope_key(fact):
    """The owner of a fact object just written (its generated column is not read back after an insert)."""
    return fact_owner_key(fact)


def _limited_fact_owners(agent_id):
    """(scope_key, limit) of every fact owner that has a limit (one agent's only, if given)."""
    limits = memory_settings.LIMITS
    per_agent = {a: o["MAX_FACTS"] for a, o in (limits["PER_AGENT"] or {}).items() if "MAX_FACTS" in o}
    if agent_id is not None:
        limit = limit_for(FACTS, agent_id) if agent_id else None
        return [(owner_key(Scope.AGENT, agent_id=agent_id), limit)] if limit is not None else []
    if limits["MAX_FACTS"] is None and not any(v is not None for v in per_agent.values()):
        return []
    qs = Fact.objects.order_by().values("scope_key").annotate(n=Count("id"))
    smallest = min(v for v in [limits["MAX_FACTS"], *per_agent.values()] if v is not None)
    owners = []
    for row in qs.filter(n__gt=smallest):
        limit = _fact_limit(row["scope_key"])
        if limit is not None and row["n"] > limit:
            owners.append((row["scope_key"], limit))
    return owners


def _groups_over_limit(kind, agent_id):
    """(group, limit) of every group of this kind over its limit (one agent's only, if given): an
    agent's episodes or procedures, or a store namespace (limited as the agent that owns it)."""
    model, group = {
        EPISODES: (Episode, "agent_id"),
        PROCEDURES: (Procedure, "agent_id"),
        STORE_ITEMS: (StoreItem, "namespace"),
    }[kind]
    qs = model.objects.order_by().values(*dict.fromkeys([group, "agent_id"])).annotate(n=Count("id"))
    if agent_id is not None:
        qs = qs.filter(agent_id=agent_id)
    result = []
    for row in qs:
        limit = limit_for(kind, row["agent_id"])
        if limit is not None and row["n"] > limit:
            result.append((row[group], limit))
    return result


def prune_all(*, agent_id=None, dry_run=False):
    """Bring every group (or one agent's) within its limits, let other apps prune, reclaim space."""
    report = PruneReport(dry_run=dry_run)
    report.deleted = dict.fromkeys((FACTS, EPISODES, PROCEDURES, STORE_ITEMS), 0)
    # Limits hold per workspace (an agent id of two tenants is two groups): unscoped, each in turn.
    current = current_workspace_id()
    for workspace_id in Workspace.objects.values_list("pk", flat=True) if current is None else [current]:
        with in_workspace(workspace_id):
            report.deleted[FACTS] += sum(
                prune_group(FACTS, key, limit, dry_run=dry_run) for key, limit in _limited_fact_owners(agent_id)
            )
            for kind in (EPISODES, PROCEDURES, STORE_ITEMS):
                report.deleted[kind] += sum(
                    prune_group(kind, key, limit, dry_run=dry_run) for key, limit in _groups_over_limit(kind, agent_id)
                )
    with transaction.atomic():
        report.deleted[VERSIONS] = sum(
            trim_versions(fact_id, limit, dry_run=dry_run) for fact_id, limit in _versions_over_limit(agent_id)
        )
    if agent_id is None:  # recall events are everyone's: only a full prune ages them out
        expired = expired_recall_events()
        report.deleted["recall_events"] = expired.count() if dry_run else expired.delete()[0]
    for _receiver, result in prune_requested.send(sender=PruneReport, agent_id=agent_id, dry_run=dry_run):
        for name, count in (result or {}).items():
            report.deleted[name] = report.deleted.get(name, 0) + count
    if report.total and not dry_run and memory_settings.LIMITS["VACUUM_AFTER_PRUNE"]:
        report.reclaimed_pages = get_backend().reclaim_space()
    return report


def recall_event_cutoff(now=None):
    """When recall events expire: PROMOTION["RECALL_EVENT_RETENTION_DAYS"] ago (None: never)."""
    days = memory_settings.PROMOTION["RECALL_EVENT_RETENTION_DAYS"]
    return None if days is None else (now or timezone.now()) - timedelta(days=days)


def expired_recall_events(cutoff=None):
    """Recall events older than the retention (none when it is None)."""
    cutoff = cutoff or recall_event_cutoff()
    return RecallEvent.objects.none() if cutoff is None else RecallEvent.objects.filter(created_at__lt=cutoff)
