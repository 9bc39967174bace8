"""Promotion: memories that recall keeps returning become durable ones, each only once.

    report = MemoryService().promote()   # `python manage.py memory promote`; also after each consolidation

A sweep reads the recall events (one per hit a recall returned, memory/recall/events.py):
- a session fact recalled at least PROMOTION["MIN_RECALLS"] times for one memory user becomes that
  user's fact (same key, value, type and confidence; provenance "promotion"), so what was useful in
  one conversation outlives it. The session fact stays as it is.
- an episode recalled at least MIN_RECALLS times in at least PROMOTION["MIN_SESSIONS"] distinct
  sessions is a recurring pattern: the consolidation extractor distils it into facts of its owner
  (a fact already stored, by its consolidation for instance, is confirmed: its confidence rises).

Every promotion is one `Promotion` row, unique per source memory: a sweep skips sources already in
the ledger, and of two concurrent sweeps only one can insert the row, in the same transaction as the
facts it writes, so the other's writes roll back. The extractor (possibly a chat model) is called
before that transaction, never inside it. Each sweep also deletes recall events older than
PROMOTION["RECALL_EVENT_RETENTION_DAYS"] (as `memory prune` does).
"""

import logging
from dataclasses import dataclass, field

from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import Count, Q
from django.utils import timezone

from ..conf import memory_settings
from ..domain.limits import expired_recall_events, recall_event_cutoff
from ..exceptions import InvalidMemoryArgument, MemoryServiceError
from ..models import Episode, Fact, Promotion, RecallEvent, RecallKind, Scope
from .consolidation import fact_owner, get_extractor

logger = logging.getLogger("engram.memory.learning.promotion")

PROVENANCE = "promotion"


@dataclass
class PromotionReport:
    """What one sweep did: the ledger rows it wrote, the sources it could not promote, events deleted."""

    dry_run: bool = False
    promoted: list[dict] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    events_deleted: int = 0

    @property
    def ok(self):
        return not self.failed

    def as_dict(self):
        return {
            "ok": self.ok,
            "dry_run": self.dry_run,
            "promoted": self.promoted,
            "failed": self.failed,
            "events_deleted": self.events_deleted,
        }


def _hits(kind, cutoff):
    """Recall events of one kind within the retention, of memories not promoted yet."""
    events = RecallEvent.objects.filter(kind=kind).exclude(
        item_id__in=Promotion.objects.filter(source_kind=kind).values("source_id")
    )
    return events if cutoff is None else events.filter(created_at__gte=cutoff)


def hot_session_facts(min_recalls, cutoff=None):
    """[(fact, user id, recalls)]: session facts recalled at least `min_recalls` times for one user."""
    counts = (
        _hits(RecallKind.FACT, cutoff)
        .filter(user_id__isnull=False)
        .values("item_id", "user_id")
        .annotate(recalls=Count("id"))
        .filter(recalls__gte=min_recalls)
        .order_by("-recalls", "item_id", "user_id")
    )
    best = {}
    for row in counts:  # a fact recalled for two users goes to the one it served most
        best.setdefault(row["item_id"], (row["user_id"], row["recalls"]))
    facts = Fact.objects.filter(pk__in=best, scope=Scope.SESSION).in_bulk()
    return [(facts[pk], *best[pk]) for pk in sorted(facts)]


def hot_episodes(min_recalls, min_sessions, cutoff=None):
    """[(episode, recalls, sessions)]: episodes recalled at least `min_recalls` times in `min_sessions` sessions."""
    counts = (
        _hits(RecallKind.EPISODE, cutoff)
        .values("item_id")
        .annotate(recalls=Count("id"), sessions=Count("session_id", distinct=True, filter=~Q(session_id="")))
        .filter(recalls__gte=min_recalls, sessions__gte=min_sessions)
    )
    found = {row["item_id"]: (row["recalls"], row["sessions"]) for row in counts}
    episodes = Episode.objects.filter(pk__in=found).in_bulk()
    return [(episodes[pk], *found[pk]) for pk in sorted(episodes)]


def _at_least_one(name, value, default):
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidMemoryArgument(name, f"must be a positive integer, got {value!r}")
    return value


def _plans(service, min_recalls, min_sessions, extractor, report):
    """[(unsaved ledger row, [set_fact kwargs])] for every hot memory not promoted yet."""
    service.flush_recall_log()  # the buffered hits count too
    cutoff = recall_event_cutoff()  # expired hits count no more, even on a dry run
    plans = []
    for fact, user_id, recalls in hot_session_facts(min_recalls, cutoff):
        row = Promotion(
            source_kind=RecallKind.FACT,
            source_id=fact.pk,
            rule=Promotion.Rule.SESSION_FACT,
            user_id=user_id,
            agent_id=fact.agent_id,
            recalls=recalls,
            sessions=1,
        )
        write = {
            "key": fact.key,
            "value": fact.value,
            "fact_type": fact.fact_type,
            "confidence": fact.confidence,
            "scope": Scope.USER,
            "user_id": user_id,
        }
        plans.append((row, [write]))
    episodes = hot_episodes(min_recalls, min_sessions, cutoff)
    if episodes and extractor is None:
        extractor = get_extractor()
    for episode, recalls, sessions in episodes:
        row = Promotion(
            source_kind=RecallKind.EPISODE,
            source_id=episode.pk,
            rule=Promotion.Rule.EPISODE,
            user_id=episode.user_id,
            agent_id=episode.agent_id,
            recalls=recalls,
            sessions=sessions,
        )
        try:  # outside any transaction: the extractor may be a chat model
            proposed = extractor.extract(episode)
        except Exception as exc:  # noqa: BLE001  (a model's errors have no common base class)
            logger.warning("promotion: extractor failed on episode %s: %s", episode.pk, exc)
            report.failed[f"episode:{episode.pk}"] = f"extractor failed: {type(exc).__name__}: {exc}"
            continue
        writes = []
        for item in proposed:
            scope, owner = fact_owner(episode, item.scope)
            writes.append(
                {"key": item.key, "value": item.value, "fact_type": item.fact_type, "confidence": item.confidence}
                | {"scope": scope, "source_episode_id": episode.pk, **owner}
            )
        plans.append((row, writes))
    return plans


def run_promotion(service, *, min_recalls=None, min_sessions=None, extractor=None, dry_run=False):
    """One sweep; returns a PromotionReport. Never raises for one source's failure (it is reported)."""
    settings = memory_settings.PROMOTION
    min_recalls = _at_least_one("min_recalls", min_recalls, settings["MIN_RECALLS"])
    min_sessions = _at_least_one("min_sessions", min_sessions, settings["MIN_SESSIONS"])
    report = PromotionReport(dry_run=dry_run)
    try:
        plans = _plans(service, min_recalls, min_sessions, extractor, report)
    except Exception as exc:  # noqa: BLE001  (the extractor's import string or constructor, or the database)
        logger.warning("promotion could not start: %s", exc, exc_info=True)
        report.failed["sweep"] = f"{type(exc).__name__}: {exc}"
        return report
    for row, writes in plans:
        source = f"{row.source_kind}:{row.source_id}"
        if dry_run:
            report.promoted.append(_entry(row, writes, []))
            continue
        try:
            with transaction.atomic():
                row.promoted_at = timezone.now()
                row.save()  # first: a concurrent sweep that promoted it already fails here, before any write
                done = [service.set_fact(**write, provenance=PROVENANCE) for write in writes]
                row.fact_ids = [w.fact.pk for w in done if w.fact is not None]
                row.save(update_fields=["fact_ids"])
        except IntegrityError:
            continue  # promoted by another sweep meanwhile
        except (MemoryServiceError, DatabaseError) as exc:
            logger.warning("promotion: %s not promoted: %s", source, exc)
            report.failed[source] = f"{type(exc).__name__}: {exc}"
            continue
        report.promoted.append(_entry(row, writes, [w.action for w in done]))
    if not dry_run:
        report.events_deleted = expired_recall_events().delete()[0]
    return report


def _entry(row, writes, actions):
    return {
        "source": f"{row.source_kind}:{row.source_id}",
        "rule": row.rule,
        "user_id": row.user_id,
        "recalls": row.recalls,
        "sessions": row.sessions,
        "facts": [{"key": w["key"], "scope": w["scope"]} for w in writes],
        "actions": actions,
        "fact_ids": row.fact_ids,
    }
