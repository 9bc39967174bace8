"""SQLite: the substring index takes fact changes in batches, through a small delta kept beside it.

FTS5 writes a new index segment in every transaction that changes it, and every later query reads
each segment until they are merged: on 100,000 facts that flush was most of a one-fact write. Now a
fact write only notes the change:
- memory_fact_fts_pending: facts whose current text the index does not hold yet (with their owner,
  so a search reads the few that concern its viewer without touching the facts);
- memory_fact_fts_stale: index entries that no longer describe their fact, with the exact values
  indexed (a contentless FTS5 table can only remove an entry when told what it held).
A fact that is pending is not in the index under its current text, so a second change before the
index catches up records no second stale entry. When the delta reaches FLUSH_AT facts, the write
that filled it moves all of it into the index (one segment), inside its own transaction.

Searches read the index and the viewer's pending facts (memory.backends.sqlite); the shared query
checks every candidate against the fact row itself, so a stale entry only costs a rejected
candidate until it is removed. PostgreSQL needs none of this: its GIN index batches on its own.
"""

from django.db import migrations

FLUSH_AT = 256
_MARK_OLD = "engram_owner_marker(old.scope_key)"
_NOT_PENDING = "WHERE NOT EXISTS (SELECT 1 FROM memory_fact_fts_pending WHERE fact_id = old.id)"
_STALE = f"INSERT INTO memory_fact_fts_stale (fact_id, search_text, owner) SELECT old.id, old.search_text, {_MARK_OLD} {_NOT_PENDING}"

# The catch-up itself, in this order: an entry is removed before its fact's new text goes in. CROSS
# JOIN: SQLite has no statistics for the delta and would otherwise scan every fact to probe it.
FLUSH = [
    "INSERT INTO memory_fact_fts (memory_fact_fts, rowid, search_text, owner) "
    "SELECT 'delete', fact_id, search_text, owner FROM memory_fact_fts_stale ORDER BY id",
    "DELETE FROM memory_fact_fts_stale",
    "INSERT INTO memory_fact_fts (rowid, search_text, owner) "
    "SELECT f.id, f.search_text, engram_owner_marker(f.scope_key) "
    "FROM memory_fact_fts_pending p CROSS JOIN memory_fact f ON f.id = p.fact_id",
    "DELETE FROM memory_fact_fts_pending",
]
FLUSH_TRIGGER = "memory_fact_fts_flush"

SQLITE_FORWARD = [
    "DROP TRIGGER memory_fact_fts_ai",
    "DROP TRIGGER memory_fact_fts_au",
    "DROP TRIGGER memory_fact_fts_ad",
    "CREATE TABLE memory_fact_fts_pending (fact_id INTEGER PRIMARY KEY, scope_key TEXT NOT NULL)",
    "CREATE TABLE memory_fact_fts_stale ("
    "id INTEGER PRIMARY KEY, fact_id INTEGER NOT NULL, search_text TEXT NOT NULL, owner TEXT NOT NULL)",
    "CREATE TRIGGER memory_fact_fts_ai AFTER INSERT ON memory_fact BEGIN "
    "INSERT INTO memory_fact_fts_pending (fact_id, scope_key) VALUES (new.id, new.scope_key); END",
    "CREATE TRIGGER memory_fact_fts_au AFTER UPDATE OF search_text, scope, agent_id, user_id, session_id "
    "ON memory_fact WHEN old.search_text IS NOT new.search_text OR old.scope_key IS NOT new.scope_key BEGIN "
    f"{_STALE}; "
    "INSERT INTO memory_fact_fts_pending (fact_id, scope_key) VALUES (new.id, new.scope_key) "
    "ON CONFLICT (fact_id) DO UPDATE SET scope_key = excluded.scope_key; END",
    "CREATE TRIGGER memory_fact_fts_ad AFTER DELETE ON memory_fact BEGIN "
    f"{_STALE}; DELETE FROM memory_fact_fts_pending WHERE fact_id = old.id; END",
    f"CREATE TRIGGER {FLUSH_TRIGGER} AFTER INSERT ON memory_fact_fts_pending "
    f"WHEN (SELECT count(*) FROM memory_fact_fts_pending) >= {FLUSH_AT} BEGIN {'; '.join(FLUSH)}; END",
]

# Back to indexing in every write (migration 0002's triggers), with the delta applied first.
_OLD = "engram_owner_marker(old.scope_key)"
_NEW = "engram_owner_marker(new.scope_key)"
SQLITE_REVERSE = [
    *FLUSH,
    f"DROP TRIGGER {FLUSH_TRIGGER}",
    "DROP TRIGGER memory_fact_fts_ai",
    "DROP TRIGGER memory_fact_fts_au",
    "DROP TRIGGER memory_fact_fts_ad",
    "DROP TABLE memory_fact_fts_pending",
    "DROP TABLE memory_fact_fts_stale",
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
]


def run_on_sqlite(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "sqlite":
            for sql in statements:
                schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [("memory", "0006_recall_index_triggers")]

    operations = [migrations.RunPython(run_on_sqlite(SQLITE_FORWARD), run_on_sqlite(SQLITE_REVERSE))]
