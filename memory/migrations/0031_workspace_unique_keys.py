"""Unique keys per workspace: two tenants may each hold the fact (agent:support-bot, tone), a person
known as telegram:42, a procedure, a store item, a team or a canonical id of the same name.

Each unique constraint takes the workspace as its last column: its leading columns stay the ones
every lookup names (the owner key and key of a fact, ...), so the index serves a read inside a
workspace and one of unscoped code alike.

PostgreSQL: Django's own constraint operations (ALTER TABLE; nothing is rebuilt). SQLite keeps
these constraints in the CREATE TABLE statement (an automatic index DROP INDEX cannot remove), so
the table is rebuilt from its own statement with only the constraint changed: the columns (the
generated owner key, the plain workspace column of 0030), the raw indexes, the views and the
triggers that read it (search and recall indexes) are made again exactly as they were, and the
AUTOINCREMENT sequence is kept, so a deleted row's id is never handed out again.

Going back makes each key unique over every workspace again: it fails (an integrity error, nothing
changed) while two workspaces hold the same key, until one of them is removed or renamed.
"""

import re

from django.db import migrations, models

# (model, table, the constraint before, its columns before, the constraint after, its columns after)
# A constraint "before" of None: the unique column of the first column list (`unique=True`).
CHANGES = [
    ("fact", "memory_fact", "one_fact_per_owner_and_key", ("scope_key", "key"), "one_fact_per_owner_and_key"),
    (
        "channelidentity",
        "memory_channelidentity",
        "one_user_per_channel_identity",
        ("channel", "external_id"),
        "one_user_per_channel_identity",
    ),
    (
        "procedure",
        "memory_procedure",
        "one_procedure_per_agent_and_name",
        ("agent_id", "name"),
        "one_procedure_per_agent_and_name",
    ),
    ("storeitem", "memory_store_item", "one_store_item_per_key", ("namespace", "key"), "one_store_item_per_key"),
    ("memoryuser", "memory_memoryuser", None, ("canonical_id",), "one_memory_user_per_canonical_id"),
    ("team", "memory_team", None, ("name",), "one_team_per_name"),
]
FIELDS = {
    "memoryuser": ("canonical_id", lambda unique: models.CharField(max_length=300, unique=unique)),
    "team": ("name", lambda unique: models.CharField(max_length=128, unique=unique)),
}


def _columns(columns):
    return ", ".join(f'"{c}"' for c in columns)


def _constraint_sql(name, columns):
    return f'CONSTRAINT "{name}" UNIQUE ({_columns(columns)})'


def _edit_create(sql, change, forwards):
    """The table's CREATE TABLE statement with the constraint of `change` after (or before) this migration."""
    _, _, before, columns, after = change
    wide = (*columns, "workspace_id")
    if before is not None:
        old, new = _constraint_sql(before, columns), _constraint_sql(after, wide)
        if not forwards:
            old, new = new, old
        if sql.count(old) != 1:
            raise RuntimeError(f"expected {old} once in {sql}")
        return sql.replace(old, new)
    column = re.escape(f'"{columns[0]}"')
    added = ", " + _constraint_sql(after, wide)
    if forwards:
        unique_column = re.compile(rf"({column} [^,]*?NOT NULL) UNIQUE")
        if len(unique_column.findall(sql)) != 1 or not sql.endswith(")"):
            raise RuntimeError(f"expected {columns[0]} UNIQUE once in {sql}")
        return unique_column.sub(r"\1", sql)[:-1] + added + ")"
    if sql.count(added) != 1:
        raise RuntimeError(f"expected {added} once in {sql}")
    return re.sub(rf"({column} [^,]*?NOT NULL)", r"\1 UNIQUE", sql.replace(added, ""), count=1)


def _sqlite_rebuild(cursor, table, edit):
    """Rebuild `table` from its own CREATE TABLE statement as `edit` changes it (SQLite's documented
    procedure: new table, copy, drop, rename), keeping its indexes, the views and triggers that
    read it, and its AUTOINCREMENT sequence."""
    cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = %s", [table])
    (create,) = cursor.fetchone()
    mentions = re.compile(rf'\b{table}\b(?!")|"{table}"')
    cursor.execute(
        "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL AND type IN ('index', 'view', 'trigger') "
        "ORDER BY rowid"
    )
    kept = [
        (kind, name, sql)
        for kind, name, sql in cursor.fetchall()
        if (kind == "index" and re.search(rf'\bON "?{table}"? ', sql)) or (kind != "index" and mentions.search(sql))
    ]
    for kind, name, _ in kept:
        if kind != "index":  # the table's indexes go with it
            cursor.execute(f'DROP {kind.upper()} "{name}"')
    cursor.execute("SELECT seq FROM sqlite_sequence WHERE name = %s", [table])
    seq = cursor.fetchone()
    cursor.execute(f'PRAGMA table_xinfo("{table}")')
    copied = _columns(row[1] for row in cursor.fetchall() if row[6] == 0)  # not generated
    staging = f"new__{table}"
    new_create = re.sub(rf'^CREATE TABLE (IF NOT EXISTS )?"?{table}"?', f'CREATE TABLE "{staging}"', edit(create))
    cursor.execute(new_create)
    cursor.execute(f'INSERT INTO "{staging}" ({copied}) SELECT {copied} FROM "{table}"')
    cursor.execute(f'DROP TABLE "{table}"')
    cursor.execute(f'ALTER TABLE "{staging}" RENAME TO "{table}"')
    for kind in ("index", "view", "trigger"):
        for found, _, sql in kept:
            if found == kind:
                cursor.execute(sql)
    if seq is not None:
        cursor.execute("UPDATE sqlite_sequence SET seq = max(seq, %s) WHERE name = %s", [seq[0], table])
        cursor.execute(
            "INSERT INTO sqlite_sequence (name, seq) SELECT %s, %s "
            "WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = %s)",
            [table, seq[0], table],
        )


def _state_operations(change):
    """The state's steps: the old unique key out, the one with the workspace last in."""
    model, _, before, columns, after = change
    new = models.UniqueConstraint(fields=[*columns, "workspace"], name=after)
    if before is not None:
        return [
            migrations.RemoveConstraint(model_name=model, name=before),
            migrations.AddConstraint(model_name=model, constraint=new),
        ]
    field_name, field = FIELDS[model]
    return [
        migrations.AlterField(model_name=model, name=field_name, field=field(False)),
        migrations.AddConstraint(model_name=model, constraint=new),
    ]


class PerWorkspaceUnique(migrations.operations.base.Operation):
    """One table's unique key made per workspace: Django's operations in the state (and on
    PostgreSQL), a rebuild from its own statement on SQLite."""

    reduces_to_sql = False
    reversible = True

    def __init__(self, model_name):
        self.model_name = model_name
        self.change = next(c for c in CHANGES if c[0] == model_name)
        self.operations = _state_operations(self.change)

    def deconstruct(self):
        return self.__class__.__name__, [self.model_name], {}

    def describe(self):
        return f"Unique keys of {self.model_name} per workspace"

    def state_forwards(self, app_label, state):
        for operation in self.operations:
            operation.state_forwards(app_label, state)

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "sqlite":
            with schema_editor.connection.cursor() as cursor:
                _sqlite_rebuild(cursor, self.change[1], lambda sql: _edit_create(sql, self.change, forwards=True))
            return
        for operation in self.operations:  # as SeparateDatabaseAndState runs its database operations
            to = from_state.clone()
            operation.state_forwards(app_label, to)
            operation.database_forwards(app_label, schema_editor, from_state, to)
            from_state = to

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "sqlite":
            with schema_editor.connection.cursor() as cursor:
                _sqlite_rebuild(cursor, self.change[1], lambda sql: _edit_create(sql, self.change, forwards=False))
            return
        # from_state: after this operation; to_state: before it. Undo each step, the last first.
        states = [to_state]
        for operation in self.operations[:-1]:
            state = states[-1].clone()
            operation.state_forwards(app_label, state)
            states.append(state)
        for operation, before in zip(reversed(self.operations), reversed(states), strict=True):
            operation.database_backwards(app_label, schema_editor, from_state, before)
            from_state = before


class Migration(migrations.Migration):
    dependencies = [("memory", "0030_workspaces")]

    operations = [PerWorkspaceUnique(change[0]) for change in CHANGES]
