"""An episode's recall document begins with its date in words ("8 May 2023"): a question that names a
month, a year or a day ("what was Jolene doing in June 2023?") finds the episodes of that time.

The answer's own words seldom say when they were said; the episode's time does (started_at). As words
of the document, the date is matched by the keyword leg like any other word (BM25 weighs it by how
few episodes share it: a year every episode has counts for nothing) and read by the embedding model.
Measured through bench.retrieval on LoCoMo (bench/README.md): 13% of its questions name a month or a
year. The line comes first so that a bare question still ends with its "?" (recall's hygiene rule)
and so that appending messages to a long episode changes only its last embedded piece, as before.

The episode triggers of migration 0006 are written again with the new text, and every existing
episode document takes it; their vectors are cleared, and the embedding worker (or `memory reindex
--missing`) embeds them again. Day and month come from started_at in UTC, in English, on both
databases, so the same episode reads the same on either.
"""

import importlib

from django.db import migrations

base = importlib.import_module("memory.migrations.0006_recall_index_triggers")

_MONTHS = "January February March April May June July August September October November December".split()
_SQLITE_DATE = (
    "coalesce(CAST(CAST(strftime('%d', {r}.started_at) AS INTEGER) AS TEXT) || ' ' || CASE strftime('%m', {r}.started_at) "
    + " ".join(f"WHEN '{n:02d}' THEN '{name}'" for n, name in enumerate(_MONTHS, start=1))
    + " END || ' ' || strftime('%Y', {r}.started_at), '')"
)
_PG_DATE = "coalesce(to_char({r}.started_at AT TIME ZONE 'UTC', 'FMDD FMMonth YYYY'), '')"


def _dated(date, text, newline, blank):
    """The date, a newline, then the text as before without its leading newline (an episode with no
    summary); an episode that says nothing yet keeps its text as before, with no date to recall. The
    text is computed once (a subquery), not once per use."""
    return (
        f"(SELECT CASE WHEN {blank.format(t='dated.t')} THEN dated.t "
        f"ELSE {date} || {newline} || ltrim(dated.t, {newline}) END FROM (SELECT {text} AS t) dated)"
    )


SQLITE_EPISODE_TEXT = _dated(_SQLITE_DATE, base._SQLITE_EPISODE_TEXT, "char(10)", "trim({t}, ' ' || char(10)) = ''")
PG_EPISODE_TEXT = _dated(_PG_DATE, base._PG_EPISODE_TEXT, "E'\\n'", "btrim({t}, E' \\n') = ''")


def _episode_triggers(vendor, text):
    """The statements of migration 0006 that (re)write the episode triggers with `text`, and the
    statement that rewrites every episode document's text (clearing its vector)."""
    common = {
        "shadow_key": "''",
        "importance": base._EPISODE_IMPORTANCE,
        "item_time": "{r}.started_at",
        "watched": base._EPISODE_WATCHED,
    }
    if vendor == "sqlite":
        ai, au, ad, _backfill = base._sqlite_item_triggers(
            "episode", "memory_episode", owner=base._SQLITE_EPISODE_OWNER, active="1", text=text, **common
        )
        create = [
            "DROP TRIGGER IF EXISTS memory_recall_episode_ai",
            "DROP TRIGGER IF EXISTS memory_recall_episode_au",
            ai,
            au,
        ]
    else:
        function, _trigger, _backfill = base._pg_item_sync(
            "episode", "memory_episode", owner=base._PG_EPISODE_OWNER, active="true", text=text, **common
        )
        create = [function]  # CREATE OR REPLACE; the trigger itself is unchanged
    rewrite = (
        f"UPDATE memory_recall_doc SET text = (SELECT {text.format(r='r')} FROM memory_episode r "
        "WHERE r.id = memory_recall_doc.item_id), embedding = NULL WHERE kind = 'episode'"
    )
    return [*create, rewrite]


def _rewrite(sqlite_text, pg_text):
    def run(apps, schema_editor):
        vendor = schema_editor.connection.vendor
        for sql in _episode_triggers(vendor, sqlite_text if vendor == "sqlite" else pg_text):
            schema_editor.execute(sql, None)  # no parameters: the SQL's % signs are its own

    return run


class Migration(migrations.Migration):
    dependencies = [("memory", "0018_fact_owner_search_index")]

    operations = [
        migrations.RunPython(
            _rewrite(SQLITE_EPISODE_TEXT, PG_EPISODE_TEXT),
            _rewrite(base._SQLITE_EPISODE_TEXT, base._PG_EPISODE_TEXT),
        )
    ]
