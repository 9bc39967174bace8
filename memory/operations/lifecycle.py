"""Memory over time: consolidation, limits and pruning, export and import, clearing, health. MemoryService delegates to it."""

import os
import socket
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..conf import memory_settings
from ..domain import limits
from ..domain.facts import FactWrite, WriteAction
from ..exceptions import InvalidMemoryArgument
from ..learning.compaction import compact_episodes
from ..learning.consolidation import consolidate_after_run, run_consolidation
from ..learning.observation import run_observe
from ..learning.procedure_learning import ProcedureLearning
from ..learning.promotion import run_promotion
from ..models import ConsolidationRun, Episode, Fact, HealthSnapshot, PeriodicRun, Procedure, Scope
from ..recall.relations import link_supports
from ..rules.validation import check_choice, check_int, check_limit, check_user_id, clean_text
from . import clearing, health, transfer


class Lifecycle:
    """Consolidation, pruning, export/import, clearing and health; MemoryService builds it and delegates."""

    def __init__(self, service, facts, episodes, users):
        self.service = service
        self.facts = facts
        self.episodes = episodes
        self.users = users

    def consolidate(self, **kwargs):
        """Distil unprocessed episodes into facts; see memory.consolidation.run_consolidation.

        Then, with PROMOTION["AFTER_CONSOLIDATION"], a promotion sweep with the same extractor (its
        report is the consolidation report's `promotion`), and with PROCEDURE_LEARNING["AFTER_CONSOLIDATION"]
        a pass of procedure learning (`procedures`; its failures join the report's errors).
        """
        report = run_consolidation(self.service, **kwargs)
        if memory_settings.PROMOTION["AFTER_CONSOLIDATION"]:
            report.promotion = self.promote(extractor=kwargs.get("extractor"))
        if memory_settings.PROCEDURE_LEARNING["AFTER_CONSOLIDATION"] and memory_settings.PROCEDURE_LEARNING["ENABLED"]:
            report.procedures = self.learn_procedures(agent_id=kwargs.get("agent_id"))
            report.errors += [f"procedure learning: {e}" for e in report.procedures.errors]
        return report

    def observe(self, messages, *, user_id, agent_id="", session_id=None, chat_model=None, episode_id=None):
        """Extract facts from one conversation turn and reconcile them with the stored ones (add, update,
        delete or none, each with a reason); see memory.learning.observation. Returns an ObserveReport.

        Call it after the reply, outside any transaction: it asks the chat model (with structured
        output) first and writes after. Without `chat_model`, the built-in rules propose the facts.
        """
        return run_observe(
            self.service,
            messages,
            user_id=user_id,
            agent_id=agent_id,
            session_id=session_id,
            chat_model=chat_model,
            episode_id=episode_id,
        )

    def promote(self, *, min_recalls=None, min_sessions=None, extractor=None, dry_run=False):
        """Promote memories recall keeps returning into durable facts, each once; see memory.learning.promotion."""
        return run_promotion(
            self.service, min_recalls=min_recalls, min_sessions=min_sessions, extractor=extractor, dry_run=bool(dry_run)
        )

    def once_per_period(self, name, seconds):
        """True for the first run of the periodic job `name` in this period of `seconds`, across every
        process and machine (once_per_period below); False for the others."""
        return once_per_period(name, seconds)

    def learn_procedures(self, *, agent_id=None):
        """Propose procedures from repeated successful runs, evolve failing ones; see memory.learning.procedure_learning."""
        return ProcedureLearning(self.service).learn_procedures(agent_id=agent_id)

    def compact_episodes(self, *, agent_id=None, older_than_days=None, min_episodes=None, dry_run=False):
        """Fold old episodes into summary episodes, archiving the originals; see memory.learning.compaction."""
        return compact_episodes(
            self.service,
            agent_id=agent_id,
            older_than_days=older_than_days,
            min_episodes=min_episodes,
            dry_run=dry_run,
        )

    def consolidate_after_run(self, episode_id):
        """For workflows, when a run ends: consolidate its episode if CONSOLIDATION["AFTER_EACH_RUN"].

        Never raises; returns the report, or None when the setting is off.
        """
        return consolidate_after_run(self.service, episode_id)

    def unconsolidated_episodes(self, *, limit, agent_id=None, episode_ids=None):
        """Finished episodes not yet processed for facts, oldest first (one agent's, or the given ids)."""
        limit = check_limit(limit, None)
        qs = Episode.objects.filter(processed_for_facts=False, ended_at__isnull=False)
        if agent_id is not None:
            qs = qs.filter(agent_id=clean_text("agent_id", agent_id, required=False, max_length=128))
        if episode_ids is not None:
            qs = qs.filter(pk__in=[check_user_id("episode_ids", pk, required=True) for pk in episode_ids])
        return list(qs.order_by("started_at", "id")[:limit])

    def store_consolidated_facts(self, episode_id, facts, *, overwrite=True, provenance="consolidation"):
        """Write the facts distilled from one episode, then mark it processed, in one transaction.

        `facts`: set_fact keyword dicts (key, value, scope and owner, fact_type, confidence). Returns
        the writes, or None when the episode was processed by someone else meanwhile (nothing is then
        written). Any failing write rolls everything back and leaves the episode unprocessed. A fact
        whose stored version changed after the episode began is left as it is (`kept_newer`): the
        run's own remember node stored it, or a later conversation said something newer.
        """
        episode = self.episodes.get_episode(episode_id)
        with transaction.atomic():
            writes = []
            for fact in facts:
                stored = self.facts.stored_fact(fact)
                if stored is not None and self._said_since(stored, episode, provenance):
                    writes.append(FactWrite(WriteAction.KEPT_NEWER, stored))
                    continue
                writes.append(
                    self.facts.set_fact(
                        **fact, overwrite=overwrite, source_episode_id=episode_id, provenance=provenance
                    )
                )
            marked = Episode.objects.filter(pk=episode_id, processed_for_facts=False).update(processed_for_facts=True)
            if not marked:
                transaction.set_rollback(True)
                return None
            # The graph's `supports` edges: each fact distilled here, to its evidence.
            distilled = (WriteAction.CREATED, WriteAction.CONFIRMED, WriteAction.UPDATED)
            link_supports([(w.fact.pk, episode_id) for w in writes if w.action in distilled])
        return writes

    def _said_since(self, fact, episode, provenance):
        """Whether `fact` holds what was said in `episode` or after it (not by consolidation replaying)."""
        if fact.source_episode_id == episode.pk:
            return True  # the run stored it itself (its remember node)
        if fact.source_episode_id is not None:
            source = Episode.objects.filter(pk=fact.source_episode_id).values_list("started_at", flat=True).first()
            return source is not None and source > episode.started_at
        return fact.updated_at >= episode.started_at and fact.provenance != provenance

    def record_consolidation_run(self, report):
        """Store a run's outcome (what /healthz shows as the last consolidation); returns its id."""
        run = ConsolidationRun.objects.create(
            started_at=report.started_at,
            finished_at=report.finished_at or timezone.now(),
            extractor=report.extractor[:200],
            agent_id=report.agent_id,
            episodes_seen=report.episodes_seen,
            episodes_processed=len(report.processed),
            episodes_failed=len(report.failed),
            facts_created=report.actions.get(WriteAction.CREATED, 0),
            facts_confirmed=report.actions.get(WriteAction.CONFIRMED, 0),
            facts_updated=report.actions.get(WriteAction.UPDATED, 0),
            facts_skipped=report.actions.get(WriteAction.SKIPPED, 0),
            errors=[*report.errors, *(f"episode {pk}: {err}" for pk, err in report.failed.items())],
        )
        return run.pk

    def last_consolidation(self):
        """The latest recorded consolidation run, or None."""
        return ConsolidationRun.objects.order_by("-started_at", "-id").first()

    def prune(self, *, agent_id=None, dry_run=False):
        """Bring memory within MEMORY["LIMITS"] (every agent, or one), let other apps prune, reclaim space.

        Returns a PruneReport; see memory.operations.pruning for what goes first.
        """
        if agent_id is not None:
            agent_id = clean_text("agent_id", agent_id, required=False, max_length=128)
        return limits.prune_all(agent_id=agent_id, dry_run=bool(dry_run))

    def export_memories(self, out, *, on_progress=None):
        """Write every memory row as JSON Lines to the text stream `out`; returns {kind: rows}.

        See memory.operations.transfer for the format. `on_progress(kind, done, total)` is called as rows go out.
        """

        self.facts.flush_access_counts()  # the export carries the counts recalls have noted so far
        return transfer.export(out, on_progress=on_progress)

    def import_memories(self, stream, *, dry_run=False, on_progress=None, allow_forgotten=False):
        """Validate a whole export, then add its new rows in one transaction; returns an ImportReport.

        `stream`: a seekable text stream. Raises ImportRejected (naming line and field) and writes
        nothing when anything is wrong. Rows whose id exists are left as stored. Rows of a person who was
        forgotten (a tombstone holds their ids) are refused unless `allow_forgotten`.
        """

        return transfer.import_(stream, dry_run=dry_run, on_progress=on_progress, allow_forgotten=allow_forgotten)

    def clear_memories(self, kinds=None, *, scope=None, agent_id=None, user_id=None, actor="command"):
        """Delete memory by kind (facts, episodes, procedures, users), scope, agent or user, atomically.

        Returns {kind: rows deleted}. See memory.operations.clearing for what each filter selects.
        """

        if scope is not None:
            scope = check_choice("scope", scope, Scope)
        if agent_id is not None:
            agent_id = clean_text("agent_id", agent_id, max_length=128)
        if user_id is not None:
            user_id = self.users.resolve_user(user_id).pk
        if kinds is not None and (isinstance(kinds, str) or not all(isinstance(k, str) for k in kinds)):
            raise InvalidMemoryArgument("kinds", "must be a list of kind names")
        self.facts.flush_access_counts()
        return clearing.clear(self.service, kinds, scope=scope, agent_id=agent_id, user_id=user_id, actor=actor)

    def memory_health(self, *, agent_id=None, fresh=True):
        """The five health metrics, score and colour band (of one agent, or all); see memory.operations.health.

        `fresh=False` may return a result up to HEALTH["CACHE_SECONDS"] old.
        """

        if agent_id is not None:
            agent_id = clean_text("agent_id", agent_id, max_length=128)
        if not fresh:
            return health.cached(agent_id)
        self.facts.flush_access_counts()  # efficiency counts recalls still buffered
        return health.compute(agent_id)

    def snapshot_health(self):
        """Today's health snapshot (UTC day) of the whole memory and of each agent that has memory (its
        facts, episodes or procedures), replacing today's earlier ones; then snapshots older than
        HEALTH["SNAPSHOT_DAYS"] days go. Run it daily (`memory health --snapshot` from cron). Returns
        the snapshots taken, the whole memory's first. Computed outside any transaction; written in one.
        """
        self.facts.flush_access_counts()
        agents = set(Fact.objects.exclude(agent_id="").values_list("agent_id", flat=True).distinct())
        agents |= set(Episode.objects.exclude(agent_id="").values_list("agent_id", flat=True).distinct())
        agents |= set(Procedure.objects.exclude(agent_id="").values_list("agent_id", flat=True).distinct())
        reports = [health.compute(None)] + [health.compute(agent) for agent in sorted(agents)]
        now = timezone.now()
        day = now.astimezone(UTC).date()
        taken = []
        with transaction.atomic():
            for report in reports:
                data = report.as_dict()
                snapshot, _ = HealthSnapshot.objects.update_or_create(
                    agent_id=report.agent_id or "",
                    day=day,
                    defaults={"score": data["score"], "band": report.band, "metrics": data["metrics"], "taken_at": now},
                )
                taken.append(snapshot)
            keep = memory_settings.HEALTH["SNAPSHOT_DAYS"]
            HealthSnapshot.objects.filter(day__lt=day - timedelta(days=keep)).delete()
        return taken

    def health_snapshots(self, *, agent_id="", days=None):
        """The daily snapshots of one agent (blank: the whole memory), oldest first; the last `days` only."""
        agent_id = clean_text("agent_id", agent_id, required=False, max_length=128)
        snapshots = HealthSnapshot.objects.filter(agent_id=agent_id).order_by("day")
        if days is not None:
            days = check_int("days", days, minimum=1, maximum=36500)
            snapshots = snapshots.filter(day__gt=timezone.now().astimezone(UTC).date() - timedelta(days=days))
        return list(snapshots)


# Once per period across machines: the guard of the beat's periodic jobs (memory/tasks.py). Two beats
# (a second machine started with one, a deploy that overlaps) each send every job of the schedule; the
# first run of a job in a period inserts its PeriodicRun row and runs, every other finds the row (a
# unique constraint) and skips. A run that dies is not repeated within its period: the jobs are
# sweeps, and the next period's run takes up what was left.

# Rows of periods older than this are deleted by each run (a record, not a ledger).
KEEP_PERIODIC_RUNS = timedelta(days=7)


def period_start(seconds, now=None):
    """The start of the period of `seconds` that `now` falls in (periods counted from the epoch, UTC)."""
    now = now or timezone.now()
    stamp = now.timestamp()
    return datetime.fromtimestamp(stamp - stamp % seconds, tz=UTC)


def once_per_period(name, seconds, *, now=None):
    """True for the first caller of `name` in the current period of `seconds`; False for every other."""
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        raise InvalidMemoryArgument("seconds", f"must be a positive number of seconds, got {seconds!r}")
    start = period_start(float(seconds), now)
    try:
        with transaction.atomic():
            PeriodicRun.objects.create(
                name=name, period_start=start, started_by=f"{socket.gethostname()}:{os.getpid()}"
            )
    except IntegrityError:
        return False
    PeriodicRun.objects.filter(name=name, period_start__lt=start - KEEP_PERIODIC_RUNS).delete()
    return True
