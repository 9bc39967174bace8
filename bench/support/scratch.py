"""A scratch database for a benchmark: a temporary SQLite file, or a throw-away PostgreSQL database."""

import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def scratch_django(database_url=None, mode=None):
    """Set Django up on a fresh, migrated database that is removed afterwards.

    `database_url` names a PostgreSQL server (postgres://user@host:port/any); a database with a
    random name is created there and dropped at the end. Without it, SQLite in a temporary folder.
    `mode` "keyword" turns the embedder off (MEMORY["EMBEDDINGS"] = None); "hybrid" needs one.
    """
    sys.path.insert(0, str(REPO / "platform"))
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    # A background thread (a WAL checkpointer, say) can write a file while the folder is being
    # removed, between the listing and the rmdir: removal is retried below instead of failing the run.
    with tempfile.TemporaryDirectory(prefix="engram-bench-", ignore_cleanup_errors=True) as tmp:
        os.environ["ENGRAM_DATA_DIR"] = tmp
        pg_admin = None
        if database_url:
            import psycopg

            name = f"engram_bench_{uuid.uuid4().hex[:8]}"
            base, _, _ = database_url.rpartition("/")
            pg_admin = (database_url, name)
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            os.environ["DATABASE_URL"] = f"{base}/{name}"
        else:
            os.environ["DATABASE_URL"] = f"sqlite:///{tmp}/bench.sqlite3"
        if mode == "keyword":  # read by the settings, here and in server processes started from here
            os.environ["ENGRAM_EMBEDDINGS"] = "none"
        import django
        from django.core.management import call_command

        django.setup()
        call_command("migrate", verbosity=0)
        try:
            yield
        finally:
            from django.db import connections

            from memory.recall.access import access_counter
            from memory.recall.events import recall_log
            from memory.recall.indexer import indexer
            from memory.recall.relations import contradictions

            indexer.wait(60)  # the embedding worker finishes with the database before it goes

            # What a benchmark noted is written while its database still exists, not at exit.
            access_counter.flush()
            recall_log.flush()
            contradictions.flush()
            connections.close_all()
            if pg_admin:
                import psycopg

                with psycopg.connect(pg_admin[0], autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{pg_admin[1]}" WITH (FORCE)')
    for _ in range(10):
        if not os.path.exists(tmp):
            break
        time.sleep(0.2)
        shutil.rmtree(tmp, ignore_errors=True)


def add_scratch_arguments(parser, *, seed=True, json_help="print exactly one JSON object"):
    """The options every benchmark takes: --seed, --database-url (a scratch database there) and --json."""
    if seed:
        parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--database-url", help="a PostgreSQL server to make a throw-away database on; default SQLite")
    parser.add_argument("--json", action="store_true", help=json_help)


def add_mode_argument(parser):
    """--mode keyword|hybrid: the recall mode to measure; default what a user gets (hybrid with the model installed)."""
    from memory.embedding.embedder import local_model_installed

    default = "hybrid" if local_model_installed() else "keyword"
    parser.add_argument(
        "--mode",
        choices=["keyword", "hybrid"],
        default=default,
        help=f"recall mode (default here: {default}, {'the local model is installed' if default == 'hybrid' else 'no local model'})",
    )


def gather_statistics():
    """After a bulk load, the planner statistics a live store of this database would have by now.

    PostgreSQL's autovacuum analyzes a table that grew, so a benchmark runs ANALYZE there. Nothing
    analyzes a SQLite store (Engram runs no ANALYZE or PRAGMA optimize), so SQLite is measured
    without statistics, as users run it: an ANALYZE here once hid a plan that read every document
    of an owner on each recall (bench/README.md, recall latency)."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")


def machine_reference():
    """A line saying how fast this machine runs Python: seconds for a fixed loop of 10 million additions.

    Figures from different machines (or one shared machine at different times) differ by more than
    most changes do; the tables print this beside their figures so runs can be compared.
    """
    start = time.perf_counter()
    total = 0
    for i in range(10_000_000):
        total += i
    return (
        f"machine reference: a 10-million-step Python loop took {time.perf_counter() - start:.2f} s (lower is faster)"
    )
