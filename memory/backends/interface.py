"""What MemoryService's concerns ask of a storage backend: the complete interface, in one place.

`MemoryBackend` (memory/backends/base.py) implements it with SQL both databases share; the SQLite
and PostgreSQL backends add what differs (substring and keyword search, procedure matching,
locking). A third database implements this Protocol; tests/test_backend_contract.py is the
conformance suite every backend must pass (CI runs it on SQLite and on PostgreSQL).
"""

from typing import Protocol, runtime_checkable


@runtime_checkable
class StorageBackend(Protocol):
    vendor: str

    # ---- facts
    def get_fact(self, key, viewer):
        """The most specific fact for `key` among the viewer's owners (merges followed), or None. One query."""

    def visible_facts(self, viewer, *, tokens=(), min_confidence=None, fact_type=None, order="key", limit=None):
        """Facts the viewer sees holding every token, shadowed ones left out, by "key" or "confidence"."""

    def pinned_facts(self, viewer):
        """The pinned facts the viewer sees, shadowed ones left out."""

    def pinned_procedures(self, agent_id):
        """The agent's and the shared active pinned procedures (the agent's own hides a shared one of its name)."""

    def set_pinned(self, model, ids, pinned):
        """Pin or unpin these rows of Fact or Procedure; how many rows changed."""

    def owned_fact(self, fact, *, lock):
        """The stored fact with the owner and key of `fact`, or None; `lock` holds it to the commit."""

    def insert_fact_if_absent(self, fact):
        """Insert `fact` unless its (owner, key) exists, under a merged user's survivor; True if inserted.
        The row is the fact's current version: no history row."""

    def count_owned_facts(self, scope_key, up_to):
        """How many facts the owner `scope_key` holds, counted no further than `up_to`. One query."""

    def update_fact(self, pk, changes, supersede=False, closes=None):
        """UPDATE one fact: column -> value, or -> (SQL over the old row, params); `supersede`: first
        keep the state it replaces as a history version (copied in the database), its valid time
        ended at `closes` when that is a time (unless it ended before)."""

    def hold_people(self, user_ids):
        """Hold these people against a concurrent forget until the transaction ends; the ids that still exist."""

    def hold_user(self, user_id):
        """Keep the user from being merged away until the transaction ends (before a write by user id)."""

    def optimize(self):
        """Compact the fact search index (after a bulk load)."""

    def bulk_load(self):
        """A context manager around many inserts inside a transaction; indexes catch up on exit."""

    # ---- episodes and procedures
    def episode_exists(self, episode_id):
        """Whether an episode with this id exists."""

    def insert_episode(self, episode):
        """Insert `episode` under its user's survivor (NULL for an unknown user); sets pk and user_id."""

    def recent_episodes(self, agent_id, user_id, limit):
        """The latest episodes of an agent and/or a user (merges followed), newest first."""

    def matching_procedures(self, goal, context_keys, agent_id, limit):
        """Active procedures (the agent's and shared) whose trigger conditions hold, best first."""

    # ---- identify (one statement each)
    def identities_of(self, channel, external_id):
        """(user, [identities]) of the surviving user behind an identity, or (None, [])."""

    def count_visit(self, user_id, when, display_name=None):
        """Count one more conversation at `when` (and set the display name when given)."""

    def context_facts(self, user_id, limit):
        """([facts], total) of a user's own facts, most confident first."""

    def context_episodes(self, user_id, limit):
        """([episodes], total) of a user's episodes, newest first."""

    # ---- recall
    def recall_owners(self, viewer, owner_terms, user_owner_sql):
        """[(owner, rank, generation, removed)] the viewer sees; catches the keyword index up first."""

    def recall_keyword(self, terms, owners, depth):
        """[(document id, score)] of the best keyword matches among `owners`, best first."""

    def recall_documents(self, doc_ids, owners, kinds, min_confidence, *, for_person=False):
        """{document id: its row} of these ids that [(owner, rank)] may see, of these kinds."""

    def recall_neighbours(self, doc_ids):
        """The documents said just before and after these episode pieces."""

    def optimize_recall_index(self):
        """Compact the keyword recall index."""

    # ---- what the database keeps of deleted rows, and consistent reads
    def scrub_after_erasure(self, tables):
        """After a deletion commits: the database lets go of what it keeps of the deleted rows of these
        tables (statistics, free pages, a write-ahead log). Returns ([tables refreshed], [problems])."""

    def reclaim_space(self):
        """Return free pages to the file system: how many (0 where the database reclaims them itself;
        None inside a transaction, where it happens at the commit)."""

    def begin_snapshot(self):
        """First thing in a new transaction: its reads become one consistent, read-only snapshot (export)."""

    # ---- LangGraph store items
    def store_rows_by_key(self, pairs, now):
        """Rows of these (joined namespace, key) pairs that have not expired."""

    def store_rows_under(self, prefix, now, equal_to, limit, *, scored=False):
        """Rows under a joined namespace prefix whose top-level fields equal `equal_to`, newest first."""

    def store_upsert(self, rows):
        """Insert rows ({StoreItem attname: value}) or update the item at their (namespace, key), keeping its
        created_at; returns {(namespace, key): id}. Inside the caller's transaction."""

    def store_namespace_names(self, prefix, now):
        """The distinct joined namespaces under a joined prefix ("" for all) holding an item alive at `now`."""

    def store_field_equals(self, name, wanted):
        """(SQL condition, parameter): an item's top-level field equals a string or number."""

    def store_equality_is_exact(self, wanted):
        """Whether store_field_equals(name, wanted) keeps exactly the items whose field == wanted."""
