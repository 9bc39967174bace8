"""Recall index upkeep: triggers keep memory_recall_doc and its keyword index in the item's transaction.

Every fact, episode and procedure has one memory_recall_doc row (kind, item id, owner, text,
importance, time), written by triggers on the item tables, so every writer (the service, the
admin, user merges, cascading deletes) keeps it current, inside its own transaction. A changed text
clears the stored embedding (the service embeds again in the same transaction; `memory reindex`
embeds whatever is missing). Triggers on memory_recall_doc keep the keyword index in step and bump
the owner's memory_recall_scope generation when an embedding or owner changes, which is what every
process's in-memory vector index checks before a recall.

SQLite: a contentless FTS5 table (porter stemming over unicode61 words, BM25 ranking) with an owner
marker column (see memory.backends.sqlite.owner_marker) weighted 0 in BM25.
PostgreSQL: a generated `tsvector` column (english configuration) with a GIN index.
"""

from django.db import migrations

# ---- what each item contributes (the same expressions for both databases where possible)

_SQLITE_EPISODE_TEXT = (
    "trim(coalesce({r}.summary, '') || char(10) || coalesce((SELECT group_concat("
    "trim(coalesce(json_extract(m.value, '$.role'), '') || ': ' || coalesce(json_extract(m.value, '$.content'), '')), "
    "char(10)) FROM json_each({r}.conversation) m), ''))"
)
_SQLITE_EPISODE_OWNER = (
    "CASE WHEN {r}.user_id IS NOT NULL AND {r}.agent_id <> '' THEN 'user:' || {r}.user_id || '/agent:' || {r}.agent_id "
    "WHEN {r}.user_id IS NOT NULL THEN 'user:' || {r}.user_id "
    "WHEN {r}.agent_id <> '' THEN 'agent:' || {r}.agent_id "
    "WHEN {r}.session_id <> '' THEN 'session:' || {r}.session_id ELSE 'global' END"
)
_SQLITE_PROCEDURE_TEXT = "{r}.name || char(10) || {r}.description || char(10) || {r}.content"
_PROCEDURE_OWNER = "CASE WHEN {r}.agent_id = '' THEN 'global' ELSE 'agent:' || {r}.agent_id END"
_PROCEDURE_IMPORTANCE = "(CAST({r}.times_succeeded AS REAL) + 1.0) / (CAST({r}.times_used AS REAL) + 2.0)"
_EPISODE_IMPORTANCE = "0.5"

_DOC_COLUMNS = "kind, item_id, owner, shadow_key, active, text, importance, item_time, vector_seq, reference_count"


def _sqlite_item_triggers(kind, table, *, owner, shadow_key, active, text, importance, item_time, watched):
    values = {
        "owner": owner,
        "shadow_key": shadow_key,
        "active": active,
        "text": text,
        "importance": importance,
        "item_time": item_time,
    }
    new = {k: v.format(r="new") for k, v in values.items()}
    return [
        f"CREATE TRIGGER memory_recall_{kind}_ai AFTER INSERT ON {table} BEGIN "
        f"INSERT INTO memory_recall_doc ({_DOC_COLUMNS}) VALUES ('{kind}', new.id, {new['owner']}, {new['shadow_key']}, "
        f"{new['active']}, {new['text']}, {new['importance']}, {new['item_time']}, 0, 0); END",
        f"CREATE TRIGGER memory_recall_{kind}_au AFTER UPDATE OF {watched} ON {table} BEGIN "
        f"UPDATE memory_recall_doc SET owner = {new['owner']}, shadow_key = {new['shadow_key']}, active = {new['active']}, "
        f"importance = {new['importance']}, item_time = {new['item_time']}, "
        f"embedding = CASE WHEN text = {new['text']} THEN embedding END, text = {new['text']} "
        f"WHERE kind = '{kind}' AND item_id = new.id; END",
        f"CREATE TRIGGER memory_recall_{kind}_ad AFTER DELETE ON {table} BEGIN "
        f"DELETE FROM memory_recall_doc WHERE kind = '{kind}' AND item_id = old.id; END",
        # Items that exist already.
        f"INSERT INTO memory_recall_doc ({_DOC_COLUMNS}) SELECT '{kind}', r.id, {owner.format(r='r')}, "
        f"{shadow_key.format(r='r')}, {active.format(r='r')}, {text.format(r='r')}, {importance.format(r='r')}, "
        f"{item_time.format(r='r')}, 0, 0 FROM {table} r",
    ]


# A fact reads as its type, key and value ("user preference editor dark mode"): asking for someone's
# preferences should find their preference facts.
_FACT_TEXT = "replace({r}.fact_type, '_', ' ') || ' ' || {r}.search_text"
_FACT_WATCHED = '"key", search_text, fact_type, scope, agent_id, user_id, session_id, confidence, updated_at'
_EPISODE_WATCHED = "summary, conversation, user_id, agent_id, session_id, started_at"
_PROCEDURE_WATCHED = "name, description, content, agent_id, is_active, times_used, times_succeeded, updated_at"

_MARK_OLD = "engram_owner_marker(old.owner)"
_MARK_NEW = "engram_owner_marker(new.owner)"

# Session neighbours of an episode (MemoryBackend.recall_neighbours) are found through this index.
EPISODE_SESSION_INDEX = "CREATE INDEX memory_episode_recall_session ON memory_episode (session_id, agent_id, id)"

SQLITE_FORWARD = [
    EPISODE_SESSION_INDEX,
    "CREATE VIRTUAL TABLE memory_recall_fts USING fts5("
    "text, owner, content='', tokenize='porter unicode61 remove_diacritics 2')",
    # BM25 over the text only; the owner marker column narrows, it never ranks.
    "INSERT INTO memory_recall_fts(memory_recall_fts, rank) VALUES ('rank', 'bm25(1.0, 0.0)')",
    "INSERT INTO memory_recall_fts(memory_recall_fts, rank) VALUES ('automerge', 8)",
    "CREATE TRIGGER memory_recall_doc_ai AFTER INSERT ON memory_recall_doc BEGIN "
    f"INSERT INTO memory_recall_fts(rowid, text, owner) VALUES (new.id, new.text, {_MARK_NEW}); "
    "INSERT INTO memory_recall_scope(owner, generation, removed) SELECT new.owner, 1, 0 WHERE new.embedding IS NOT NULL "
    "ON CONFLICT(owner) DO UPDATE SET generation = generation + 1; "
    "UPDATE memory_recall_doc SET vector_seq = (SELECT generation FROM memory_recall_scope WHERE owner = new.owner) "
    "WHERE id = new.id AND new.embedding IS NOT NULL; END",
    "CREATE TRIGGER memory_recall_doc_au_text AFTER UPDATE OF text, owner ON memory_recall_doc "
    "WHEN old.text IS NOT new.text OR old.owner IS NOT new.owner BEGIN "
    f"INSERT INTO memory_recall_fts(memory_recall_fts, rowid, text, owner) VALUES ('delete', old.id, old.text, {_MARK_OLD}); "
    f"INSERT INTO memory_recall_fts(rowid, text, owner) VALUES (new.id, new.text, {_MARK_NEW}); END",
    "CREATE TRIGGER memory_recall_doc_au_vector AFTER UPDATE OF embedding, owner ON memory_recall_doc "
    "WHEN old.embedding IS NOT new.embedding OR old.owner IS NOT new.owner BEGIN "
    "UPDATE memory_recall_scope SET removed = removed + 1 "
    "WHERE owner = old.owner AND old.owner IS NOT new.owner AND old.embedding IS NOT NULL; "
    "INSERT INTO memory_recall_scope(owner, generation, removed) VALUES (new.owner, 1, 0) "
    "ON CONFLICT(owner) DO UPDATE SET generation = generation + 1; "
    "UPDATE memory_recall_doc SET vector_seq = (SELECT generation FROM memory_recall_scope WHERE owner = new.owner) "
    "WHERE id = new.id; END",
    "CREATE TRIGGER memory_recall_doc_ad AFTER DELETE ON memory_recall_doc BEGIN "
    f"INSERT INTO memory_recall_fts(memory_recall_fts, rowid, text, owner) VALUES ('delete', old.id, old.text, {_MARK_OLD}); "
    "UPDATE memory_recall_scope SET removed = removed + 1 WHERE owner = old.owner AND old.embedding IS NOT NULL; END",
    *_sqlite_item_triggers(
        "fact",
        "memory_fact",
        owner="{r}.scope_key",
        shadow_key='{r}."key"',
        active="1",
        text=_FACT_TEXT,
        importance="{r}.confidence",
        item_time="{r}.updated_at",
        watched=_FACT_WATCHED,
    ),
    *_sqlite_item_triggers(
        "episode",
        "memory_episode",
        owner=_SQLITE_EPISODE_OWNER,
        shadow_key="''",
        active="1",
        text=_SQLITE_EPISODE_TEXT,
        importance=_EPISODE_IMPORTANCE,
        item_time="{r}.started_at",
        watched=_EPISODE_WATCHED,
    ),
    *_sqlite_item_triggers(
        "procedure",
        "memory_procedure",
        owner=_PROCEDURE_OWNER,
        shadow_key="{r}.name",
        active="{r}.is_active",
        text=_SQLITE_PROCEDURE_TEXT,
        importance=_PROCEDURE_IMPORTANCE,
        item_time="{r}.updated_at",
        watched=_PROCEDURE_WATCHED,
    ),
]
SQLITE_REVERSE = [
    *[
        f"DROP TRIGGER IF EXISTS memory_recall_{k}_{op}"
        for k in ("fact", "episode", "procedure")
        for op in ("ai", "au", "ad")
    ],
    *[f"DROP TRIGGER IF EXISTS memory_recall_doc_{op}" for op in ("ai", "au_text", "au_vector", "ad")],
    "DROP TABLE IF EXISTS memory_recall_fts",
    "DROP INDEX IF EXISTS memory_episode_recall_session",
    "DELETE FROM memory_recall_doc",
]

# ---- PostgreSQL: plpgsql trigger functions

_PG_EPISODE_TEXT = (
    "trim(coalesce({r}.summary, '') || E'\\n' || coalesce((SELECT string_agg("
    "trim(coalesce(m ->> 'role', '') || ': ' || coalesce(m ->> 'content', '')), E'\\n' ORDER BY n) "
    "FROM jsonb_array_elements(CASE WHEN jsonb_typeof({r}.conversation) = 'array' THEN {r}.conversation ELSE '[]'::jsonb END) "
    "WITH ORDINALITY AS c(m, n)), ''))"
)
_PG_EPISODE_OWNER = (
    "CASE WHEN {r}.user_id IS NOT NULL AND {r}.agent_id <> '' THEN 'user:' || {r}.user_id || '/agent:' || {r}.agent_id "
    "WHEN {r}.user_id IS NOT NULL THEN 'user:' || {r}.user_id "
    "WHEN {r}.agent_id <> '' THEN 'agent:' || {r}.agent_id "
    "WHEN {r}.session_id <> '' THEN 'session:' || {r}.session_id ELSE 'global' END"
)
_PG_PROCEDURE_TEXT = "{r}.name || E'\\n' || {r}.description || E'\\n' || {r}.content::text"
_PG_PROCEDURE_IMPORTANCE = "({r}.times_succeeded::float + 1.0) / ({r}.times_used::float + 2.0)"


def _pg_item_sync(kind, table, *, owner, shadow_key, active, text, importance, item_time, watched):
    new = {
        "owner": owner.format(r="NEW"),
        "shadow_key": shadow_key.format(r="NEW"),
        "active": active.format(r="NEW"),
        "text": text.format(r="NEW"),
        "importance": importance.format(r="NEW"),
        "item_time": item_time.format(r="NEW"),
    }
    return [
        f"CREATE OR REPLACE FUNCTION memory_recall_{kind}_sync() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF TG_OP = 'DELETE' THEN DELETE FROM memory_recall_doc WHERE kind = '{kind}' AND item_id = OLD.id; RETURN NULL; END IF; "
        f"INSERT INTO memory_recall_doc ({_DOC_COLUMNS}) VALUES ('{kind}', NEW.id, {new['owner']}, {new['shadow_key']}, "
        f"{new['active']}, {new['text']}, {new['importance']}, {new['item_time']}, 0, 0) "
        "ON CONFLICT (kind, item_id) DO UPDATE SET owner = EXCLUDED.owner, shadow_key = EXCLUDED.shadow_key, "
        "active = EXCLUDED.active, importance = EXCLUDED.importance, item_time = EXCLUDED.item_time, "
        "embedding = CASE WHEN memory_recall_doc.text = EXCLUDED.text THEN memory_recall_doc.embedding END, "
        "text = EXCLUDED.text; RETURN NULL; END $$",
        f"CREATE TRIGGER memory_recall_{kind}_sync AFTER INSERT OR DELETE OR UPDATE OF {watched} ON {table} "
        f"FOR EACH ROW EXECUTE FUNCTION memory_recall_{kind}_sync()",
        f"INSERT INTO memory_recall_doc ({_DOC_COLUMNS}) SELECT '{kind}', r.id, {owner.format(r='r')}, "
        f"{shadow_key.format(r='r')}, {active.format(r='r')}, {text.format(r='r')}, {importance.format(r='r')}, "
        f"{item_time.format(r='r')}, 0, 0 FROM {table} r",
    ]


POSTGRESQL_FORWARD = [
    EPISODE_SESSION_INDEX,
    "ALTER TABLE memory_recall_doc ADD COLUMN tsv tsvector GENERATED ALWAYS AS (to_tsvector('english', text)) STORED",
    "CREATE INDEX memory_recall_doc_tsv ON memory_recall_doc USING gin (tsv)",
    # Generation bumps: a new or changed embedding, or a new owner, moves the owner's generation on
    # and stamps the document with it; a document leaving an owner counts as removed there.
    "CREATE OR REPLACE FUNCTION memory_recall_doc_vector() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF TG_OP = 'DELETE' THEN "
    "  IF OLD.embedding IS NOT NULL THEN UPDATE memory_recall_scope SET removed = removed + 1 WHERE owner = OLD.owner; END IF; "
    "  RETURN OLD; END IF; "
    "IF TG_OP = 'UPDATE' AND NEW.owner IS DISTINCT FROM OLD.owner AND OLD.embedding IS NOT NULL THEN "
    "  UPDATE memory_recall_scope SET removed = removed + 1 WHERE owner = OLD.owner; END IF; "
    "IF (TG_OP = 'INSERT' AND NEW.embedding IS NOT NULL) OR (TG_OP = 'UPDATE' AND ("
    "    NEW.embedding IS DISTINCT FROM OLD.embedding OR NEW.owner IS DISTINCT FROM OLD.owner)) THEN "
    "  INSERT INTO memory_recall_scope (owner, generation, removed) VALUES (NEW.owner, 1, 0) "
    "  ON CONFLICT (owner) DO UPDATE SET generation = memory_recall_scope.generation + 1 "
    "  RETURNING generation INTO NEW.vector_seq; END IF; "
    "RETURN NEW; END $$",
    "CREATE TRIGGER memory_recall_doc_vector BEFORE INSERT OR UPDATE OR DELETE ON memory_recall_doc "
    "FOR EACH ROW EXECUTE FUNCTION memory_recall_doc_vector()",
    *_pg_item_sync(
        "fact",
        "memory_fact",
        owner="{r}.scope_key",
        shadow_key="{r}.key",
        active="true",
        text=_FACT_TEXT,
        importance="{r}.confidence",
        item_time="{r}.updated_at",
        watched=_FACT_WATCHED,
    ),
    *_pg_item_sync(
        "episode",
        "memory_episode",
        owner=_PG_EPISODE_OWNER,
        shadow_key="''",
        active="true",
        text=_PG_EPISODE_TEXT,
        importance=_EPISODE_IMPORTANCE,
        item_time="{r}.started_at",
        watched=_EPISODE_WATCHED,
    ),
    *_pg_item_sync(
        "procedure",
        "memory_procedure",
        owner=_PROCEDURE_OWNER,
        shadow_key="{r}.name",
        active="{r}.is_active",
        text=_PG_PROCEDURE_TEXT,
        importance=_PG_PROCEDURE_IMPORTANCE,
        item_time="{r}.updated_at",
        watched=_PROCEDURE_WATCHED,
    ),
]
POSTGRESQL_REVERSE = [
    *[f"DROP TRIGGER IF EXISTS memory_recall_{k}_sync ON memory_{k}" for k in ("fact", "episode", "procedure")],
    *[f"DROP FUNCTION IF EXISTS memory_recall_{k}_sync()" for k in ("fact", "episode", "procedure")],
    "DROP TRIGGER IF EXISTS memory_recall_doc_vector ON memory_recall_doc",
    "DROP FUNCTION IF EXISTS memory_recall_doc_vector()",
    "DROP INDEX IF EXISTS memory_recall_doc_tsv",
    "ALTER TABLE memory_recall_doc DROP COLUMN IF EXISTS tsv",
    "DROP INDEX IF EXISTS memory_episode_recall_session",
    "DELETE FROM memory_recall_doc",
]


def run_for_vendor(statements):
    def run(apps, schema_editor):
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [("memory", "0005_recall_index")]

    operations = [
        migrations.RunPython(
            run_for_vendor({"sqlite": SQLITE_FORWARD, "postgresql": POSTGRESQL_FORWARD}),
            run_for_vendor({"sqlite": SQLITE_REVERSE, "postgresql": POSTGRESQL_REVERSE}),
        ),
    ]
