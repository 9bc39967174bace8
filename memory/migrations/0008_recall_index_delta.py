"""SQLite: the recall keyword index takes document changes through a delta, as the substring index does (0007).

FTS5 writes an index segment in every transaction that changes it; on 100,000 facts that cost a
one-fact write about as much as all its other statements. Document triggers now only note the change
(memory_recall_fts_pending: documents whose current text the index lacks; memory_recall_fts_stale:
entries to remove, with the values indexed). The delta moves into the index when it reaches
FLUSH_AT documents, inside the write that filled it, and before any keyword recall reads the index
(memory.backends.sqlite): BM25 can only rank what the index holds. PostgreSQL needs none of this.
"""

from django.db import migrations

FLUSH_AT = 256
_NOT_PENDING = "WHERE NOT EXISTS (SELECT 1 FROM memory_recall_fts_pending WHERE doc_id = old.id)"
_STALE = (
    "INSERT INTO memory_recall_fts_stale (doc_id, text, owner) "
    f"SELECT old.id, old.text, engram_owner_marker(old.owner) {_NOT_PENDING}"
)
# CROSS JOIN: SQLite has no statistics for the delta and could otherwise scan every document.
FLUSH = [
    "INSERT INTO memory_recall_fts (memory_recall_fts, rowid, text, owner) "
    "SELECT 'delete', doc_id, text, owner FROM memory_recall_fts_stale ORDER BY id",
    "DELETE FROM memory_recall_fts_stale",
    "INSERT INTO memory_recall_fts (rowid, text, owner) SELECT d.id, d.text, engram_owner_marker(d.owner) "
    "FROM memory_recall_fts_pending p CROSS JOIN memory_recall_doc d ON d.id = p.doc_id",
    "DELETE FROM memory_recall_fts_pending",
]

# The vector bookkeeping of migration 0006's triggers, unchanged.
_SCOPE_AFTER_INSERT = (
    "INSERT INTO memory_recall_scope(owner, generation, removed) SELECT new.owner, 1, 0 WHERE new.embedding IS NOT NULL "
    "ON CONFLICT(owner) DO UPDATE SET generation = generation + 1; "
    "UPDATE memory_recall_doc SET vector_seq = (SELECT generation FROM memory_recall_scope WHERE owner = new.owner) "
    "WHERE id = new.id AND new.embedding IS NOT NULL;"
)
_SCOPE_AFTER_DELETE = (
    "UPDATE memory_recall_scope SET removed = removed + 1 WHERE owner = old.owner AND old.embedding IS NOT NULL;"
)
_TEXT_CHANGED = "WHEN old.text IS NOT new.text OR old.owner IS NOT new.owner"

SQLITE_FORWARD = [
    "DROP TRIGGER memory_recall_doc_ai",
    "DROP TRIGGER memory_recall_doc_au_text",
    "DROP TRIGGER memory_recall_doc_ad",
    "CREATE TABLE memory_recall_fts_pending (doc_id INTEGER PRIMARY KEY)",
    "CREATE TABLE memory_recall_fts_stale (id INTEGER PRIMARY KEY, doc_id INTEGER NOT NULL, text TEXT, owner TEXT)",
    "CREATE TRIGGER memory_recall_doc_ai AFTER INSERT ON memory_recall_doc BEGIN "
    f"INSERT INTO memory_recall_fts_pending (doc_id) VALUES (new.id); {_SCOPE_AFTER_INSERT} END",
    f"CREATE TRIGGER memory_recall_doc_au_text AFTER UPDATE OF text, owner ON memory_recall_doc {_TEXT_CHANGED} BEGIN "
    f"{_STALE}; INSERT OR IGNORE INTO memory_recall_fts_pending (doc_id) VALUES (new.id); END",
    "CREATE TRIGGER memory_recall_doc_ad AFTER DELETE ON memory_recall_doc BEGIN "
    f"{_STALE}; DELETE FROM memory_recall_fts_pending WHERE doc_id = old.id; {_SCOPE_AFTER_DELETE} END",
    "CREATE TRIGGER memory_recall_fts_flush AFTER INSERT ON memory_recall_fts_pending "
    f"WHEN (SELECT count(*) FROM memory_recall_fts_pending) >= {FLUSH_AT} BEGIN {'; '.join(FLUSH)}; END",
]

# Back to indexing in every write (migration 0006's triggers), with the delta applied first.
_MARK_OLD = "engram_owner_marker(old.owner)"
_MARK_NEW = "engram_owner_marker(new.owner)"
SQLITE_REVERSE = [
    *FLUSH,
    "DROP TRIGGER memory_recall_fts_flush",
    "DROP TRIGGER memory_recall_doc_ai",
    "DROP TRIGGER memory_recall_doc_au_text",
    "DROP TRIGGER memory_recall_doc_ad",
    "DROP TABLE memory_recall_fts_pending",
    "DROP TABLE memory_recall_fts_stale",
    "CREATE TRIGGER memory_recall_doc_ai AFTER INSERT ON memory_recall_doc BEGIN "
    f"INSERT INTO memory_recall_fts(rowid, text, owner) VALUES (new.id, new.text, {_MARK_NEW}); {_SCOPE_AFTER_INSERT} END",
    f"CREATE TRIGGER memory_recall_doc_au_text AFTER UPDATE OF text, owner ON memory_recall_doc {_TEXT_CHANGED} BEGIN "
    f"INSERT INTO memory_recall_fts(memory_recall_fts, rowid, text, owner) VALUES ('delete', old.id, old.text, {_MARK_OLD}); "
    f"INSERT INTO memory_recall_fts(rowid, text, owner) VALUES (new.id, new.text, {_MARK_NEW}); END",
    "CREATE TRIGGER memory_recall_doc_ad AFTER DELETE ON memory_recall_doc BEGIN "
    f"INSERT INTO memory_recall_fts(memory_recall_fts, rowid, text, owner) VALUES ('delete', old.id, old.text, {_MARK_OLD}); "
    f"{_SCOPE_AFTER_DELETE} END",
]


def run_on_sqlite(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "sqlite":
            for sql in statements:
                schema_editor.execute(sql, params=None)

    return run


class Migration(migrations.Migration):
    dependencies = [("memory", "0007_fact_search_index_delta")]

    operations = [migrations.RunPython(run_on_sqlite(SQLITE_FORWARD), run_on_sqlite(SQLITE_REVERSE))]
