"""Fact history keeps only superseded states: a fact's current version lives on its own row.

Every write used to add a version row that copied the fact as the write left it, so a create cost
a second row (and its index pages) in the same transaction: fact history added 21-40% to set time
(bench/README.md). Now, as in SQL:2011 system-versioned tables, a change first copies the state it
supersedes into memory_fact_version, and the fact row says how its current state came to be
(change_action, and the writer when it is not the value's own). The view memory_fact_history
(model FactHistory) reads both as one history; a current version's id there is -(fact id).

Forward: each live fact takes its latest version's action, writer and start, and that version row
goes (the edges of the memory graph never point at a latest version: a `contradicts` edge points at
the version before an update). The new columns are added with ALTER TABLE ... ADD COLUMN, not
Django's AddField, which on SQLite would rebuild memory_fact and drop the triggers of its indexes.
"""

from django.db import migrations, models

FACT, VERSION, VIEW = "memory_fact", "memory_fact_version", "memory_fact_history"

ADD_COLUMNS = [
    f"ALTER TABLE {FACT} ADD COLUMN change_action varchar(16) NOT NULL DEFAULT 'created'",
    f"ALTER TABLE {FACT} ADD COLUMN change_source_episode_id bigint NULL",
    f"ALTER TABLE {FACT} ADD COLUMN change_provenance text NULL",
]
DROP_COLUMNS = [
    f"ALTER TABLE {FACT} DROP COLUMN change_provenance",
    f"ALTER TABLE {FACT} DROP COLUMN change_source_episode_id",
    f"ALTER TABLE {FACT} DROP COLUMN change_action",
]

_COLUMNS = (
    'fact_id, action, "key", value, fact_type, scope, scope_key, user_id, agent_id, session_id, '
    "confidence, source_episode_id, provenance, valid_from"
)
# A fact's current version, as the columns of a version: the writer is the value's own unless the
# change names one (change_provenance set).
CURRENT_VERSION = (
    'f.id, f.change_action, f."key", f.value, f.fact_type, f.scope, f.scope_key, f.user_id, f.agent_id, '
    "f.session_id, f.confidence, "
    "CASE WHEN f.change_provenance IS NULL THEN f.source_episode_id ELSE f.change_source_episode_id END, "
    "COALESCE(f.change_provenance, f.provenance), f.updated_at"
)
CREATE_VIEW = (
    f'CREATE VIEW {VIEW} (id, {_COLUMNS}, "current") AS '
    f"SELECT v.id, {', '.join('v.' + c.strip() for c in _COLUMNS.split(','))}, FALSE FROM {VERSION} v "
    f"UNION ALL SELECT -f.id, {CURRENT_VERSION}, TRUE FROM {FACT} f"
)
DROP_VIEW = f"DROP VIEW {VIEW}"

_LATEST = f"SELECT {{}} FROM {VERSION} v WHERE v.fact_id = {FACT}.id ORDER BY v.valid_from DESC, v.id DESC LIMIT 1"
# A live fact's latest version is its current state, unless history was off for its later writes
# (the version is then older than the row, and stays a version; the row says `created` by its own writer).
_IS_CURRENT = f"({_LATEST.format('v.valid_from')}) >= {FACT}.updated_at"
_FOLDED_IDS = f"SELECT ({_LATEST.format('v.id')}) FROM {FACT} WHERE {_IS_CURRENT}"
_FOLDED = (
    ("change_action", "v.action"),
    ("change_source_episode_id", "v.source_episode_id"),
    ("change_provenance", "v.provenance"),
    ("updated_at", "v.valid_from"),
)
FOLD_LATEST_VERSIONS = [
    f"DELETE FROM memory_relation WHERE target_version_id IN ({_FOLDED_IDS})",
    f"UPDATE {FACT} SET {', '.join(f'{c} = ({_LATEST.format(s)})' for c, s in _FOLDED)} WHERE {_IS_CURRENT}",
    # updated_at now equals the folded version's valid_from, so _IS_CURRENT still names the same rows.
    f"DELETE FROM {VERSION} WHERE id IN ({_FOLDED_IDS})",
]
# Backward: every live fact's current version becomes a row again.
UNFOLD_CURRENT_VERSIONS = [f"INSERT INTO {VERSION} ({_COLUMNS}) SELECT {CURRENT_VERSION} FROM {FACT} f"]


class Migration(migrations.Migration):
    dependencies = [("memory", "0016_fact_search_pending_list")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(ADD_COLUMNS, DROP_COLUMNS)],
            state_operations=[
                migrations.AddField(
                    model_name="fact",
                    name="change_action",
                    field=models.CharField(
                        choices=[
                            ("created", "Created"),
                            ("confirmed", "Confirmed"),
                            ("updated", "Updated"),
                            ("skipped", "Skipped"),
                            ("deleted", "Deleted"),
                        ],
                        default="created",
                        max_length=16,
                    ),
                ),
                migrations.AddField(
                    model_name="fact",
                    name="change_source_episode_id",
                    field=models.BigIntegerField(blank=True, null=True),
                ),
                migrations.AddField(
                    model_name="fact",
                    name="change_provenance",
                    field=models.TextField(blank=True, default=None, null=True),
                ),
            ],
        ),
        migrations.RunSQL(FOLD_LATEST_VERSIONS, UNFOLD_CURRENT_VERSIONS),
        migrations.RunSQL(CREATE_VIEW, DROP_VIEW),
        migrations.CreateModel(
            name="FactHistory",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("fact_id", models.BigIntegerField()),
                (
                    "action",
                    models.CharField(
                        choices=[
                            ("created", "Created"),
                            ("confirmed", "Confirmed"),
                            ("updated", "Updated"),
                            ("skipped", "Skipped"),
                            ("deleted", "Deleted"),
                        ],
                        max_length=16,
                    ),
                ),
                ("key", models.CharField(max_length=255)),
                ("value", models.JSONField()),
                (
                    "fact_type",
                    models.CharField(
                        choices=[
                            ("user_preference", "User preference"),
                            ("world_knowledge", "World knowledge"),
                            ("self_knowledge", "Self knowledge"),
                            ("correction", "Correction"),
                            ("relationship", "Relationship"),
                        ],
                        max_length=32,
                    ),
                ),
                (
                    "scope",
                    models.CharField(
                        choices=[("session", "Session"), ("user", "User"), ("agent", "Agent"), ("global", "Global")],
                        max_length=16,
                    ),
                ),
                ("scope_key", models.CharField(max_length=300)),
                ("agent_id", models.CharField(blank=True, max_length=128)),
                ("session_id", models.CharField(blank=True, max_length=128)),
                ("confidence", models.FloatField()),
                ("source_episode_id", models.BigIntegerField(blank=True, null=True)),
                ("provenance", models.TextField(blank=True)),
                ("valid_from", models.DateTimeField()),
                ("current", models.BooleanField()),
                (
                    "user",
                    models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        null=True,
                        on_delete=models.deletion.DO_NOTHING,
                        related_name="+",
                        to="memory.memoryuser",
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "fact history",
                "db_table": "memory_fact_history",
                "ordering": ["valid_from", "id"],
                "managed": False,
            },
        ),
    ]
