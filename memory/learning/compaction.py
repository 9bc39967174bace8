"""Compaction: an agent's old episodes folded into one summary episode; the originals archived, out of recall.

    report = MemoryService().compact_episodes()                  # `memory compact`
    MemoryService().compact_episodes(agent_id="helper", older_than_days=30, dry_run=True)

Finished episodes that started more than COMPACTION["AFTER_DAYS"] ago are grouped by owner (agent and
user; without a user, agent and session), so a summary is seen by exactly whoever saw its originals.
A group of at least MIN_EPISODES becomes, in one transaction, one episode (trigger type `compaction`,
started when the first original started) whose summary lists each original's date and gist, oldest
first, within MAX_SUMMARY_CHARS (the newest lines are kept when it runs out), and whose final output
names the originals and counts their outcomes. The originals move to `ArchivedEpisode` (their columns
as JSON, the summary they went into) and leave the episode table, so recall's index (kept by the
database's triggers) drops them and finds the summary instead; facts consolidated from them stay,
their `source_episode` cleared; their recall events go, and the deletions audit trail records the move
(actor "compaction"). Summaries are never compacted again. Deterministic, no model needed.
"""

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, transaction
from django.forms.models import model_to_dict
from django.utils import timezone

from ..conf import memory_settings
from ..exceptions import InvalidMemoryArgument, MemoryServiceError
from ..models import ArchivedEpisode, Episode
from ..rules.validation import check_limit, clean_text
from ..text import clip

logger = logging.getLogger("engram.memory.compaction")

TRIGGER = "compaction"
GIST_CHARS = 300


@dataclass
class CompactionReport:
    dry_run: bool = False
    groups: list[dict] = field(default_factory=list)  # {"agent_id", "user_id", "session_id", "episodes", "summary_id"}
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self):
        return not self.errors

    @property
    def archived(self):
        return sum(len(g["episodes"]) for g in self.groups if g["summary_id"] or self.dry_run)

    def as_dict(self):
        return {
            "ok": self.ok,
            "dry_run": self.dry_run,
            "archived": self.archived,
            "summaries": [g["summary_id"] for g in self.groups if g["summary_id"]],
            "groups": self.groups,
            "errors": list(self.errors),
        }


def summary_text(episodes, max_chars):
    """One line per episode, oldest first: date, outcome, gist; the newest lines win when space runs out."""
    lines = []
    for e in episodes:
        outcome = {True: "", False: " (failed)", None: ""}[e.success]
        gist = " ".join((e.gist or e.trigger_type or "run").split())
        lines.append(f"- {e.started_at.date().isoformat()}{outcome}: {clip(gist, GIST_CHARS)}")
    kept, size = [], 0
    for line in reversed(lines):
        if size + len(line) + 1 > max_chars:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join(reversed(kept))


def _archived_record(episode):
    """The episode's columns as JSON values (dates as ISO 8601 text)."""
    data = model_to_dict(episode)
    data.update(id=episode.pk, started_at=episode.started_at, ended_at=episode.ended_at)
    return json.loads(DjangoJSONEncoder().encode(data))


def compact_episodes(service, *, agent_id=None, older_than_days=None, min_episodes=None, dry_run=False):
    """Fold old episodes into summaries (see the module); returns a CompactionReport. Never raises for one group's failure."""
    conf = memory_settings.COMPACTION
    days = conf["AFTER_DAYS"] if older_than_days is None else older_than_days
    if isinstance(days, bool) or not isinstance(days, (int, float)) or days < 0:
        raise InvalidMemoryArgument("older_than_days", "must be a number of days, 0 or more")
    least = check_limit(conf["MIN_EPISODES"] if min_episodes is None else min_episodes, 5)
    if least < 2:
        raise InvalidMemoryArgument("min_episodes", "must be at least 2")
    report = CompactionReport(dry_run=bool(dry_run))
    old = Episode.objects.filter(ended_at__isnull=False, started_at__lt=timezone.now() - timedelta(days=days))
    old = old.exclude(trigger_type=TRIGGER)
    if agent_id is not None:
        old = old.filter(agent_id=clean_text("agent_id", agent_id, required=False, max_length=128))
    groups = defaultdict(list)
    for episode in old.order_by("started_at", "id")[: conf["MAX_EPISODES_PER_RUN"]]:
        session = "" if episode.user_id is not None else episode.session_id
        groups[(episode.agent_id, episode.user_id, session)].append(episode)
    for (agent, user_id, session), episodes in groups.items():
        if len(episodes) < least:
            continue
        entry = {
            "agent_id": agent,
            "user_id": user_id,
            "session_id": session,
            "episodes": [e.pk for e in episodes],
            "summary_id": None,
        }
        report.groups.append(entry)
        if dry_run:
            continue
        try:
            entry["summary_id"] = _compact_group(service, agent, user_id, session, episodes, conf)
        except (MemoryServiceError, DatabaseError) as exc:
            logger.warning("compaction of %s episodes of agent %r failed: %s", len(episodes), agent, exc)
            report.errors.append(f"agent {agent!r}, user {user_id}: {type(exc).__name__}: {exc}")
    return report


def _compact_group(service, agent, user_id, session, episodes, conf):
    ids = [e.pk for e in episodes]
    outcomes = {
        "succeeded": sum(e.success is True for e in episodes),
        "failed": sum(e.success is False for e in episodes),
    }
    with transaction.atomic():
        # Only the episodes still there: another run, or a delete, may have taken some since.
        still = set(Episode.objects.select_for_update().filter(pk__in=ids).values_list("pk", flat=True))
        episodes = [e for e in episodes if e.pk in still]
        if len(episodes) < 2:
            return None
        summary = service.record_episode(
            started_at=episodes[0].started_at,
            agent_id=agent,
            user_id=user_id,
            session_id=session,
            trigger_type=TRIGGER,
            success=True,
            summary=summary_text(episodes, conf["MAX_SUMMARY_CHARS"]),
            final_output={"compacted": len(episodes), "episode_ids": [e.pk for e in episodes], **outcomes},
        )
        ArchivedEpisode.objects.bulk_create(
            [
                ArchivedEpisode(
                    episode_id=e.pk,
                    agent_id=e.agent_id,
                    user_id=e.user_id,
                    summary_episode=summary,
                    started_at=e.started_at,
                    record=_archived_record(e),
                )
                for e in episodes
            ]
        )
        # As any delete of episodes: their recall events and admin log entries go too, and the audit
        # trail says "compaction" moved them out.
        service.delete_episodes([e.pk for e in episodes], actor=TRIGGER)
    return summary.pk
