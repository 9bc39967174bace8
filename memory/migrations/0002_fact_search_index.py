"""Substring search index on facts: SQLite FTS5 trigram (owner-aware), PostgreSQL pg_trgm GIN.

SQLite: a contentless FTS5 table indexes each fact's search_text and, in a second column, a
three-character owner marker (see memory.backends.sqlite.owner_marker), so one MATCH narrows to
the owners a viewer may see. Triggers keep it in step inside the row's own transaction.
"""

from django.db import migrations

_OLD = "engram_owner_marker(old.scope_key)"
_NEW = "engram_owner_marker(new.scope_key)"
SQLITE_FORWARD = [
    "CREATE VIRTUAL TABLE memory_fact_fts USING fts5(search_text, owner, content='', tokenize='trigram')",
    # Every write transaction adds a segment; merging 8 at a time instead of 4 roughly halves the
    # index's share of a one-fact write, and queries still read few segments.
    "INSERT INTO memory_fact_fts(memory_fact_fts, rank) VALUES ('automerge', 8)",
    "CREATE TRIGGER memory_fact_fts_ai AFTER INSERT ON memory_fact BEGIN "
    f"INSERT INTO memory_fact_fts(rowid, search_text, owner) VALUES (new.id, new.search_text, {_NEW}); END",
    "CREATE TRIGGER memory_fact_fts_ad AFTER DELETE ON memory_fact BEGIN "
    "INSERT INTO memory_fact_fts(memory_fact_fts, rowid, search_text, owner) "
    f"VALUES ('delete', old.id, old.search_text, {_OLD}); END",
    "CREATE TRIGGER memory_fact_fts_au AFTER UPDATE OF search_text, scope, agent_id, user_id, session_id "
    "ON memory_fact BEGIN "
    "INSERT INTO memory_fact_fts(memory_fact_fts, rowid, search_text, owner) "
    f"VALUES ('delete', old.id, old.search_text, {_OLD}); "
    f"INSERT INTO memory_fact_fts(rowid, search_text, owner) VALUES (new.id, new.search_text, {_NEW}); END",
    "INSERT INTO memory_fact_fts(rowid, search_text, owner) "
    "SELECT id, search_text, engram_owner_marker(scope_key) FROM memory_fact",
]
SQLITE_REVERSE = [
    "DROP TRIGGER IF EXISTS memory_fact_fts_au",
    "DROP TRIGGER IF EXISTS memory_fact_fts_ad",
    "DROP TRIGGER IF EXISTS memory_fact_fts_ai",
    "DROP TABLE IF EXISTS memory_fact_fts",
]
POSTGRESQL_FORWARD = [
    "CREATE EXTENSION IF NOT EXISTS pg_trgm",
    "CREATE INDEX IF NOT EXISTS memory_fact_search_trgm ON memory_fact USING gin (search_text gin_trgm_ops)",
]
POSTGRESQL_REVERSE = ["DROP INDEX IF EXISTS memory_fact_search_trgm"]


def run_for_vendor(statements):
    def run(apps, schema_editor):
        for sql in statements.get(schema_editor.connection.vendor, []):
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [("memory", "0001_initial")]

    operations = [
        migrations.RunPython(
            run_for_vendor({"sqlite": SQLITE_FORWARD, "postgresql": POSTGRESQL_FORWARD}),
            run_for_vendor({"sqlite": SQLITE_REVERSE, "postgresql": POSTGRESQL_REVERSE}),
        ),
    ]
