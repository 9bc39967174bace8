"""Memory over time: consolidation, limits and pruning, export and import, clearing, health. MemoryService delegates to it."""

from django.db import transaction
from django.utils import timezone

from ..conf import memory_settings
from ..domain import limits
from ..domain.facts import FactWrite, WriteAction
from ..exceptions import InvalidMemoryArgument
from ..models import ConsolidationRun, Episode, Scope
from ..recall.relations import link_supports
from ..rules.validation import check_choice, check_limit, check_user_id, clean_text
from . import clearing, health, transfer
from .compaction import compact_episodes
from .consolidation import consolidate_after_run, run_consolidation
from .procedure_learning import ProcedureLearning
from .promotion import run_promotion


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

    def promote(self, *, min_recalls=None, min_sessions=None, extractor=None, dry_run=False):
        """Promote memories recall keeps returning into durable facts, each once; see memory.operations.promotion."""
        return run_promotion(
            self.service, min_recalls=min_recalls, min_sessions=min_sessions, extractor=extractor, dry_run=bool(dry_run)
        )

    def learn_procedures(self, *, agent_id=None):
        """Propose procedures from repeated successful runs, evolve failing ones; see memory.operations.procedure_learning."""
        return ProcedureLearning(self.service).learn_procedures(agent_id=agent_id)

    def compact_episodes(self, *, agent_id=None, older_than_days=None, min_episodes=None, dry_run=False):
        """Fold old episodes into summary episodes, archiving the originals; see memory.operations.compaction."""
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
