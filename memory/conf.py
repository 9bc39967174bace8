"""Settings of the memory app: the MEMORY dict in Django settings, read with defaults."""

from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

DEFAULTS = {
    # Dotted path of the storage backend; None picks the one for the database vendor.
    "BACKEND": None,
    # Confidence of a fact written without one.
    "DEFAULT_CONFIDENCE": 0.8,
    # Re-asserting the same value moves confidence this share of the way to 1.
    "CONFIRM_WEIGHT": 0.2,
    # A contradiction that is not written lowers confidence by this share.
    "CONTRADICT_WEIGHT": 0.2,
    "SEARCH_LIMIT": 10,
    "SEARCH_MIN_CONFIDENCE": 0.0,
    "RECENT_EPISODES": 5,
    "CONTEXT_FACTS": 50,
    # Access counts are buffered in memory and written in one statement when this many facts are
    # pending, at the end of each request, at exit, or on MemoryService.flush_access_counts().
    "ACCESS_FLUSH_PENDING": 5000,
    # Keep a version of every change of a fact (memory/domain/history.py): what `memory history` shows and
    # point-in-time reads (`as_of=`) answer from. False: no versions are written; deletes forget at once.
    "FACT_HISTORY": True,
    # Operators' REST API: most ids one batch-delete request may name, the largest request body
    # accepted (bytes), and the page size of list endpoints (a client may ask for up to MAX).
    "API_MAX_BATCH_IDS": 1000,
    "API_MAX_BODY_BYTES": 256 * 1024,
    "API_PAGE_SIZE": 50,
    "API_MAX_PAGE_SIZE": 500,
    # GET /metrics (Prometheus): a bearer token the scraper must send; blank: open, as /healthz is.
    "METRICS_TOKEN": "",
    # ---- lifecycle: consolidation, limits and pruning, health (nested dicts merge with these defaults)
    "CONSOLIDATION": {
        # Dotted path of the extractor: the built-in rules (no model needed) or the LLM extractor.
        "EXTRACTOR": "memory.consolidation.RuleExtractor",
        # For the LLM extractor: dotted path of a LangChain chat model class or factory, and its kwargs.
        "MODEL": None,
        "MODEL_KWARGS": {},
        # Unprocessed episodes taken per run, oldest first.
        "MAX_EPISODES_PER_RUN": 20,
        # Characters of an episode's transcript shown to the LLM extractor.
        "MAX_TRANSCRIPT_CHARS": 8000,
        # Confidence of facts the built-in rules extract.
        "RULE_CONFIDENCE": 0.6,
        # A consolidated fact with a different value than the stored one replaces it (counted as a
        # contradiction); False keeps the stored value and lowers its confidence instead.
        "OVERWRITE": True,
        # Read by workflows: consolidate the run's episode when a run ends.
        "AFTER_EACH_RUN": False,
    },
    # Procedures that learn (memory/learning/procedure_learning.py): proposed from repeated successful
    # runs, evolved when their success rate falls; every one written inactive, for a person to approve.
    "PROCEDURE_LEARNING": {
        "ENABLED": True,
        # Run by MemoryService.consolidate (`memory consolidate`) after the facts.
        "AFTER_CONSOLIDATION": True,
        # Successful runs of one kind (agent, workflow, tool sequence) before a procedure is proposed.
        "MIN_EPISODES": 3,
        # Episodes looked at: finished in the last LOOKBACK_DAYS, at most MAX_EPISODES, newest first.
        "LOOKBACK_DAYS": 30,
        "MAX_EPISODES": 500,
        # Words of the runs' first messages kept as a proposal's goal_contains condition.
        "MAX_TRIGGER_WORDS": 3,
        # An active procedure used at least EVOLVE_MIN_USES times with a success rate below
        # EVOLVE_BELOW gets an evolved child.
        "EVOLVE_MIN_USES": 5,
        "EVOLVE_BELOW": 0.5,
    },
    # Compaction (memory/learning/compaction.py, `memory compact`): episodes that started more than
    # AFTER_DAYS ago are folded, per owner, into one summary episode once there are MIN_EPISODES of
    # them; the originals are archived (kept, out of recall).
    "COMPACTION": {
        "AFTER_DAYS": 90,
        "MIN_EPISODES": 5,
        # Characters of a summary (one line per original; the newest lines are kept).
        "MAX_SUMMARY_CHARS": 4000,
        # Old episodes read per run, oldest first.
        "MAX_EPISODES_PER_RUN": 5_000,
    },
    # The memory graph (memory/recall/relations.py): a newly embedded memory is linked to its SIMILAR_TOP
    # closest memories of the same owner with a cosine of at least SIMILAR_MIN_COSINE (for the local
    # model, 0.8 is a paraphrase or the same topic in other words, not just a shared subject).
    "RELATIONS": {"SIMILAR": True, "SIMILAR_TOP": 3, "SIMILAR_MIN_COSINE": 0.8},
    # Promotion (memory/learning/promotion.py): memories recalled often become durable ones, each once.
    "PROMOTION": {
        # Recall hits a memory needs before it is promoted.
        "MIN_RECALLS": 3,
        # An episode is a recurring pattern when it was recalled in at least this many sessions.
        "MIN_SESSIONS": 2,
        # Sweep after each consolidation run (MemoryService.consolidate, `memory consolidate`).
        "AFTER_CONSOLIDATION": True,
        # Recall events older than this are deleted by each sweep and by `memory prune`; None keeps all.
        "RECALL_EVENT_RETENTION_DAYS": 90,
    },
    "LIMITS": {
        # Facts per owner (each agent, user, session, and global); None: no limit. Facts are upserted
        # per key, so they grow with distinct keys only; a limit costs one COUNT per created fact.
        "MAX_FACTS": None,
        # Facts one person (a memory user) may own at user scope. Reached, a new key is refused
        # (LimitReached), never evicted: one person's flood must not push out what they said before,
        # and an operator decides what goes. Updates and confirmations of their keys still go in.
        "MAX_FACTS_PER_USER": 1_000,
        # Episodes per agent ("" counts as one agent) and procedures per agent ("" = shared ones).
        "MAX_EPISODES": 10_000,
        "MAX_PROCEDURES": 1_000,
        # Versions kept per fact (fact history), the oldest pruned first; None: every version.
        "MAX_VERSIONS_PER_FACT": 100,
        # LangGraph store items per namespace (EngramStore), the least recently written evicted
        # first; None: no limit. An agent's override applies to its ("agents", <id>, ...) namespaces.
        "MAX_STORE_ITEMS": None,
        # Per-agent overrides: {"support-bot": {"MAX_FACTS": 500, "MAX_EPISODES": 200}}.
        "PER_AGENT": {},
        # SQLite: after a prune deletes rows, give free pages back to the file system.
        "VACUUM_AFTER_PRUNE": True,
    },
    "HEALTH": {
        # Freshness halves every this many days of median fact age.
        "FRESHNESS_HALF_LIFE_DAYS": 30,
        # Efficiency looks at facts at least this old (younger ones had no chance to be recalled).
        "EFFICIENCY_MIN_AGE_DAYS": 1,
        # How long /healthz and `memory health` reuse a computed score.
        "CACHE_SECONDS": 60,
        # Daily snapshots (`memory health --snapshot`) older than this many days are deleted by the next one.
        "SNAPSHOT_DAYS": 90,
    },
    # EngramStore's namespaces that belong to a person (memory/domain/store_items.py): {first label: identity
    # channel}; the second label is the person's id on that channel (an application's own user id),
    # resolved through Engram's identities like any channel's id. ("users", "42") and langmem's
    # ("memories", "42") are the person with identity langgraph:42, never memory user 42 (Engram's ids
    # are named only by the reserved ("engram", "users", "<memory user id>", ...)). A label mapped to
    # None is nobody's (global).
    "STORE_NAMESPACES": {"users": "langgraph", "memories": "langgraph"},
    # ---- recall (MemoryService.recall; see memory/recall/ranking.py)
    # "auto": the local all-MiniLM-L6-v2 when the `embeddings` extra is installed; None: keyword-only;
    # or a dotted path to a LangChain Embeddings class/factory (called with EMBEDDINGS_OPTIONS).
    "EMBEDDINGS": "auto",
    "EMBEDDINGS_OPTIONS": {},
    # Recorded with the stored vectors; blank derives it from the embedder's class and model name.
    "EMBEDDINGS_MODEL_ID": "",
    # "background": a write's vector is computed after it commits, by the process's embedding worker,
    # in batches (memory/recall/indexer.py); "inline": inside the write's transaction (tests, scripts).
    "EMBED_ON_WRITE": "background",
    # Most texts the worker embeds in one model call, and how long it waits for more writers to
    # join a smaller batch (a write's vector comes at most this much later; its row never waits).
    "EMBED_BATCH": 64,
    # Which episodes recall embeds, by kind (trigger type: "telegram", "chat", a record_episode category):
    # None embeds every episode; a list only those kinds (the others stay in keyword recall).
    "EMBED_EPISODE_KINDS": None,
    # 250 ms: on a busy server a model call of a few texts costs little more than one of a single text
    # (per text, a batch of six takes two thirds of the CPU of six calls), and each batch is also a
    # claim and a store transaction, which on SQLite take the write lock the requests need.
    "EMBED_WAIT_MS": 250,
    # How long a committed write's vector may take before its batch is embedded at the requests'
    # priority instead of in the CPU they leave (memory/embedding/model_process.py): vector recall finds a
    # write within about this much, however busy the machine, at the cost of the requests' CPU.
    "EMBED_DUE_MS": 500,
    # Longer recall texts (long episodes) are embedded in pieces of at most this many words, each a
    # vector of its document: ~1.3 word pieces per English word keeps a piece within the 128 word
    # pieces the local model was trained on (memory.embedding.embedder.split_pieces).
    "EMBED_PIECE_WORDS": 96,
    # A worker's lease on the pending documents of a batch it embeds (memory/recall/claims.py): past it,
    # another worker takes them over (the first one died). Longer than the slowest model call of a batch.
    "EMBED_CLAIM_SECONDS": 120,
    # An idle embedding worker looks for documents left pending (by processes that stopped, or whose
    # claim expired) this often; the Celery beat schedules the same sweep as a task.
    "EMBED_SWEEP_SECONDS": 60,
    # Background work on Celery (memory/tasks.py, docs/guides/several-machines.md): the broker URL
    # (redis://..., amqp://...), also read from ENGRAM_TASK_BROKER by the site's settings. Blank: the
    # embedded default, where each process embeds on its own worker thread and nothing else starts.
    "TASK_BROKER": "",
    # Seconds between runs of each periodic task the beat schedules, each run once per period across
    # every beat and machine (a PeriodicRun row); None leaves a job out of the schedule.
    "TASK_PERIODS": {
        "embed_pending": 30,
        "consolidate": 300,
        "promote": 3600,
        "prune": 86400,
        "deliver_reminders": 10,
    },
    # Query vectors kept per process, by text (a repeated question skips the model).
    "QUERY_EMBEDDING_CACHE": 1024,
    "RECALL_LIMIT": 10,
    # Hops recall walks along the memory graph from its hits (memory/recall/relations.py); 0: none.
    "RECALL_WALK_DEPTH": 0,
    # The MCP server over HTTP (`memory mcp --http`): {bearer token: {"agent": id, "user": memory user id or None}}.
    "MCP_TOKENS": {},
    # How the keyword and vector legs combine (memory/recall/ranking.py): "standardized" (each leg's scores
    # standardized over its own candidates and summed; nothing to tune) or "weighted" (fitted on
    # LoCoMo): RECALL_KEYWORD_WEIGHT of (bm25 / best bm25) ** RECALL_KEYWORD_POWER, the cosine the rest.
    "RECALL_FUSION": "standardized",
    "RECALL_KEYWORD_WEIGHT": 0.6,
    "RECALL_KEYWORD_POWER": 2.0,
    # How many candidates each leg hands to the fusion.
    "RECALL_CANDIDATES": 200,
    # Session context: shares of the relevance of the episodes 1 before, 1 after, 2 before, 2 after
    # (same session, agent and user) added to an episode's; and of the session's best candidate.
    "RECALL_CONTEXT_WEIGHTS": (0.35, 0.2, 0.25, 0.15),
    "RECALL_SESSION_WEIGHT": 0.4,
    # An episode's relevance x (its length / the median length of the episodes ranked) ** this: what
    # a longer turn says is more likely to hold what is asked for (memory/recall/ranking.py, step 4). Chosen
    # by 5-fold cross-validation on LoCoMo among 0, 1/4 and 1/2 (bench/README.md); 0 turns it off.
    "RECALL_LENGTH_EXPONENT": 0.25,
    # What asking is worth against stating: an episode's relevance counts 1 - (1 - this) x its share
    # of sentences that are questions (a bare question: this share); what it gives up goes to the
    # turn after it, its answer (memory/recall/ranking.py, step 4).
    "RECALL_BARE_QUESTION_WEIGHT": 0.5,
    # Share of the final score that importance, recency and references decide (the rest is relevance).
    "RECALL_BOOST_WEIGHT": 0.1,
    # Recency falls linearly to a floor of 0.1 over this many days.
    "RECALL_RECENCY_DAYS": 180,
    # Recall events and reference counts are buffered and written in one transaction when this many
    # hits are pending, at the end of each request, at exit, or on MemoryService.flush_recall_log().
    "RECALL_FLUSH_PENDING": 5000,
    # Forgetting a person on SQLite truncates the WAL after the commit, retrying while a reader holds
    # older frames for at most this many seconds; past it the deletion's result says the WAL was kept.
    "ERASURE_WAL_WAIT_SECONDS": 10,
    # Threads numpy's BLAS may use, set when the vector index is first built (process-wide). Idle
    # BLAS threads spin, and on a small busy machine they take the cores a recall's own statements
    # and the requests need; the scans are small enough for one thread. None: leave it.
    "VECTOR_BLAS_THREADS": 1,
    # Megabytes of vectors one process keeps in its vector index (memory/recall/vectors.py), over all
    # owners; past it, the owners least recently used are dropped and loaded again when next needed.
    # About 1.8 KB per 384-dimension vector (docs/guides/vector-memory.md). None: no cap.
    "VECTOR_CACHE_MB": 256,
}

BACKENDS_BY_VENDOR = {
    "sqlite": "memory.backends.sqlite.SQLiteBackend",
    "postgresql": "memory.backends.postgresql.PostgreSQLBackend",
}


class MemorySettings:
    """Attribute access to MEMORY settings with defaults, like DRF's api_settings."""

    def __init__(self, defaults):
        self._defaults = defaults
        self._cache = {}

    def __getattr__(self, name):
        if name not in self._defaults:
            raise AttributeError(f"Unknown MEMORY setting: {name!r}")
        if name not in self._cache:
            user = getattr(settings, "MEMORY", {}) or {}
            value = user.get(name, self._defaults[name])
            if isinstance(self._defaults[name], dict) and isinstance(value, dict):
                value = {**self._defaults[name], **value}  # nested settings keep their other defaults
            self._cache[name] = value
        return self._cache[name]

    def reload(self):
        self._cache.clear()

    def backend_class(self, vendor):
        path = self.BACKEND or BACKENDS_BY_VENDOR.get(vendor)
        if path is None:
            raise LookupError(f"No memory backend for database vendor {vendor!r}; set MEMORY['BACKEND'].")
        return import_string(path)


memory_settings = MemorySettings(DEFAULTS)


def on_memory_settings_changed(reset):
    """Connect `reset()` to run whenever the MEMORY setting changes (tests' override_settings).

    Each module that caches something derived from MEMORY connects its own reset here; this module
    imports none of them (settings sit below everything that reads them).
    """

    def receiver(*, setting, **kwargs):
        if setting == "MEMORY":
            reset()

    setting_changed.connect(receiver, weak=False)
    return receiver


on_memory_settings_changed(memory_settings.reload)
