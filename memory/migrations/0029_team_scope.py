"""Team scope: a named group of agents (Team, TeamMember) shares facts of scope "team", owner key
"team:<team id>", between the agent's own and everyone's in the lookup order.

memory_fact takes a `team` foreign key, and its generated owner key (scope_key) a case for the new
scope. Neither database can change a generated column's expression in place (PostgreSQL 15 has no
SET EXPRESSION; SQLite none at all), so the column is dropped and added again with its unique
constraint and indexes, and the owner checks are replaced. On SQLite those steps rebuild the table,
which drops the triggers that keep the fact search and recall indexes (0002, 0006, 0007) and would
fail on the view and the trigger that read memory_fact: they are set aside first and made again
after, each trigger watching team_id too (a fact moved to another team changes owner), and the
AUTOINCREMENT sequence is kept so a deleted fact's id (its history keeps it) is never handed out again.
On PostgreSQL the fact recall trigger watches team_id too, and the owner-aware trigram index of 0018
(dropped with the column) is made again.
"""

import re
from functools import partial
from importlib import import_module

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Case, Q, Value, When
from django.db.models.functions import Cast, Concat

view = import_module("memory.migrations.0022_valid_time")
recall_triggers = import_module("memory.migrations.0006_recall_index_triggers")
owner_search = import_module("memory.migrations.0018_fact_owner_search_index")

FACT = "memory_fact"
SET_ASIDE = "engram_set_aside_0029"
SCOPES = [("session", "Session"), ("user", "User"), ("agent", "Agent"), ("team", "Team"), ("global", "Global")]
_WATCHING = re.compile(r"(AFTER UPDATE OF )(.*?)( ON memory_fact )")


def _key(scope, *parts):
    return When(scope=scope, then=Concat(Value(f"{scope}:"), *parts))


def scope_key(*, teams):
    """memory_fact.scope_key's field, with the team case or (before this migration) without it."""
    whens = [
        _key("session", "session_id"),
        _key("user", Cast("user_id", models.CharField())),
        _key("agent", "agent_id"),
    ]
    if teams:
        whens.append(_key("team", Cast("team_id", models.CharField())))
    return models.GeneratedField(
        expression=Case(*whens, default=Value("global")),
        output_field=models.CharField(max_length=300),
        db_persist=True,
    )


def team_field():
    return models.ForeignKey(
        blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name="facts", to="memory.team"
    )


def owner_check(*, teams):
    no_team = {"team__isnull": True} if teams else {}
    owners = [
        Q(scope="session", user__isnull=True, agent_id="", **no_team) & ~Q(session_id=""),
        Q(scope="user", user__isnull=False, agent_id="", session_id="", **no_team),
        Q(scope="agent", user__isnull=True, session_id="", **no_team) & ~Q(agent_id=""),
        Q(scope="global", user__isnull=True, agent_id="", session_id="", **no_team),
    ]
    if teams:
        owners.insert(3, Q(scope="team", user__isnull=True, agent_id="", session_id="", team__isnull=False))
    condition = owners[0]
    for owner in owners[1:]:
        condition |= owner
    return models.CheckConstraint(condition=condition, name="fact_scope_has_its_owner")


def scope_known(*, teams):
    values = [v for v, _ in SCOPES if teams or v != "team"]
    return models.CheckConstraint(condition=Q(scope__in=values), name="fact_scope_known")


def _sqlite_readers(cursor):
    """[(name, SQL)] of the triggers that read or watch memory_fact (not its sibling tables)."""
    cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name")
    return [(name, sql) for name, sql in cursor.fetchall() if re.search(r"\bmemory_fact\b(?!_)", sql)]


def set_aside(apps, schema_editor):
    """Before the column changes: drop the view (and on SQLite the triggers) that depend on memory_fact."""
    schema_editor.execute(view.before.DROP_VIEW)
    if schema_editor.connection.vendor != "sqlite":
        return
    with schema_editor.connection.cursor() as cursor:
        readers = _sqlite_readers(cursor)
        cursor.execute(f"CREATE TEMP TABLE {SET_ASIDE} (name TEXT, sql TEXT, seq INTEGER)")
        cursor.execute("SELECT seq FROM sqlite_sequence WHERE name = %s", [FACT])
        seq = cursor.fetchone()
        for name, sql in readers:
            cursor.execute(f"INSERT INTO {SET_ASIDE} VALUES (%s, %s, %s)", [name, sql, seq[0] if seq else 0])
            cursor.execute(f"DROP TRIGGER {name}")


def restore(apps, schema_editor, *, teams):
    """After the column changes: make the view and the triggers set aside again (watching team_id
    when `teams`), and keep the fact ids' sequence where it was."""
    vendor = schema_editor.connection.vendor
    if vendor == "sqlite":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(f"SELECT name, sql, seq FROM {SET_ASIDE}")
            rows = cursor.fetchall()
            for _, sql, _ in rows:
                cursor.execute(_WATCHING.sub(lambda m: m[1] + _watched(m[2], teams) + m[3], sql))
            seq = max([0, *(row[2] for row in rows)])
            cursor.execute("UPDATE sqlite_sequence SET seq = max(seq, %s) WHERE name = %s", [seq, FACT])
            cursor.execute(
                "INSERT INTO sqlite_sequence (name, seq) SELECT %s, %s "
                "WHERE %s > 0 AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = %s)",
                [FACT, seq, seq, FACT],
            )
            cursor.execute(f"DROP TABLE {SET_ASIDE}")
    elif vendor == "postgresql":
        watched = _watched(recall_triggers._FACT_WATCHED, teams)
        # Going back, dropping team_id took the trigger watching it along.
        schema_editor.execute(f"DROP TRIGGER IF EXISTS memory_recall_fact_sync ON {FACT}")
        schema_editor.execute(
            f"CREATE TRIGGER memory_recall_fact_sync AFTER INSERT OR DELETE OR UPDATE OF {watched} ON {FACT} "
            "FOR EACH ROW EXECUTE FUNCTION memory_recall_fact_sync()"
        )
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {owner_search.NEW} ON {FACT} USING gin (scope_key, search_text gin_trgm_ops) "
            "WITH (gin_pending_list_limit = 128)"
        )
    schema_editor.execute(view.CREATE_VIEW)


def _watched(columns, teams):
    names = [c.strip() for c in columns.split(",") if c.strip() != "team_id"]
    return ", ".join([*names, "team_id"] if teams else names)


def drop_team_facts(apps, schema_editor):
    """Going back: the scopes before this migration have no place for a team's facts."""
    apps.get_model("memory", "Fact").objects.filter(scope="team").delete()


class Migration(migrations.Migration):
    dependencies = [("memory", "0028_store_search_index")]

    operations = [
        migrations.CreateModel(
            name="Team",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=128, unique=True)),
                ("description", models.TextField(blank=True, default="")),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
            options={
                "ordering": ["name"],
                "constraints": [models.CheckConstraint(condition=~Q(name=""), name="team_name_not_blank")],
            },
        ),
        migrations.CreateModel(
            name="TeamMember",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("agent_id", models.CharField(max_length=128)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                (
                    "team",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="members", to="memory.team"
                    ),
                ),
            ],
            options={
                "db_table": "memory_team_member",
                "ordering": ["team", "agent_id"],
                "constraints": [
                    models.UniqueConstraint(fields=("agent_id", "team"), name="one_membership_per_agent_and_team"),
                    models.CheckConstraint(condition=~Q(agent_id=""), name="team_member_agent_not_blank"),
                ],
            },
        ),
        migrations.RunPython(set_aside, partial(restore, teams=False)),
        migrations.RemoveConstraint(model_name="fact", name="fact_scope_known"),
        migrations.RemoveConstraint(model_name="fact", name="fact_scope_has_its_owner"),
        migrations.RemoveConstraint(model_name="fact", name="one_fact_per_owner_and_key"),
        migrations.RemoveIndex(model_name="fact", name="fact_owner_confidence"),
        # The database drops scope_key and adds it again, which AlterField refuses to do for a
        # generated column; the state keeps it in place with its new expression.
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RemoveField(model_name="fact", name="scope_key"),
                migrations.AddField(model_name="fact", name="team", field=team_field()),
                migrations.AddField(model_name="fact", name="scope_key", field=scope_key(teams=True)),
            ],
            state_operations=[
                migrations.AddField(model_name="fact", name="team", field=team_field()),
                migrations.AlterField(model_name="fact", name="scope_key", field=scope_key(teams=True)),
            ],
        ),
        migrations.AlterField(model_name="fact", name="scope", field=models.CharField(choices=SCOPES, max_length=16)),
        migrations.AlterField(
            model_name="factversion", name="scope", field=models.CharField(choices=SCOPES, max_length=16)
        ),
        migrations.AlterField(
            model_name="storeitem", name="scope", field=models.CharField(choices=SCOPES, max_length=16)
        ),
        migrations.AddConstraint(model_name="fact", constraint=scope_known(teams=True)),
        migrations.AddConstraint(model_name="fact", constraint=owner_check(teams=True)),
        migrations.AddConstraint(
            model_name="fact",
            constraint=models.UniqueConstraint(fields=["scope_key", "key"], name="one_fact_per_owner_and_key"),
        ),
        migrations.AddIndex(
            model_name="fact", index=models.Index(fields=["scope_key", "-confidence"], name="fact_owner_confidence")
        ),
        # A version keeps its fact's team by number, as it keeps the fact (fact_id): its history outlives both.
        migrations.AddField(
            model_name="factversion", name="team_id", field=models.BigIntegerField(blank=True, null=True)
        ),
        migrations.RunPython(partial(restore, teams=True), set_aside),
        migrations.RunPython(migrations.RunPython.noop, drop_team_facts),
    ]
