"""Export and import of the memory as JSON Lines: users, identities, episodes, procedures, facts, fact
history, promotions and the memory graph's edges (and what other apps register: store items, reminders).

Internal to the memory service: call `MemoryService.export_memories()` / `import_memories()` (the
`memory export` / `memory import` commands).

The format, one JSON object per line:

    {"format": "engram-memory", "version": 1, "exported_at": "...", "database": "sqlite", "counts": {"user": 2, ...}}
    {"kind": "user", "id": 1, "canonical_id": "telegram:42", "display_name": "Ada", ...}
    {"kind": "identity", "id": 1, "user_id": 1, "channel": "telegram", "external_id": "42", ...}
    {"kind": "fact", "id": 7, "key": "favourite_colour", "value": "green", "scope": "user", "user_id": 1, ...}
    {"kind": "fact_version", "id": 31, "fact_id": 7, "action": "updated", "value": "green", "valid_from": ...}
    {"kind": "relation", "id": 4, "source_kind": "fact", "source_item": 7, "relation": "contradicts",
     "target_kind": "fact_version", "target_item": 30, "weight": 1.0, "created_at": ...}

Rows carry every stored column by its attribute name (foreign keys as `<name>_id`), timestamps as
ISO 8601, JSON columns as JSON. Columns the database derives are left out and rebuilt on import:
a fact's owner (`scope_key`, a generated column; a fact version's copy of it too) and its search
text (`search_text`, which the search index triggers read). Derived index rows (search index entries, embeddings) are not exported
either: they follow from the source rows. The header's counts let an import notice a cut-off file.

An export is one consistent snapshot (one transaction; on PostgreSQL REPEATABLE READ). An import
validates the whole file before writing anything, naming the line and field of every problem; then
writes every new row in one transaction (all or nothing), with the ids, timestamps and relations of
the file. A row whose id already exists is left as the database has it, so importing a file twice
adds nothing. A row whose id is free but whose natural key (a fact's owner and key, a channel
identity, a user's canonical id, an agent's procedure name) belongs to another row is an error.
Imports do not apply LIMITS (run `memory prune` after, if wanted). Consolidation run records are
operational logs, not memory: neither exported nor cleared.

Fact history came in the same format version: a fact row carries its current version (how its
state came to be, `change_*`) and `fact_version` rows the states it superseded. A file from before
history has no versions, and each fact's history starts with its row (`created`, valid from its
`updated_at`); a file from before the current state moved onto the fact row lists it as the fact's
latest version, which the import moves onto the fact. Promotions (`promotion`, unique per source) and
the memory graph's edges (`relation`) came the same way. An edge names the memories it joins by kind
and id (a `contradicts` edge's target is a fact version), never by recall document (a derived row):
edges are inserted after every other row and pointed at the documents the imported items got. An
edge already stored under another id is refused by the database, naming the lines. More kinds (another app's tables) join with
`register_kind(TransferKind(...))`.
"""

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime

from django.core.management.color import no_style
from django.db import (
    DEFAULT_DB_ALIAS,
    IntegrityError,
    connection,
    connections,
    models,
    transaction,
)
from django.utils import timezone

from ..backends import get_backend
from ..domain import history
from ..exceptions import ImportRejected, InvalidMemoryArgument
from ..models.workspaces import current_workspace_id
from ..recall.relations import contradictions
from ..rules import validation
from . import tombstones
from .transfer_kinds import FORMAT, KINDS, VERSION, TransferKind, kinds_by_name

_BATCH = 2000
_MAX_ERRORS = 20


def export(out, *, on_progress=None):
    """Write the header and every row to the text stream `out`; returns {kind: rows}."""
    kinds = list(KINDS)
    outermost = not connection.in_atomic_block  # inside a caller's transaction, its snapshot rules
    if outermost:
        contradictions.flush()  # the edges of this process's latest writes belong in the file
    with transaction.atomic():
        if outermost:
            get_backend().begin_snapshot()
        counts = {k.name: (k.export_queryset() if k.export_queryset else k.model.objects).count() for k in kinds}
        header = {
            "format": FORMAT,
            "version": VERSION,
            "exported_at": timezone.now().isoformat(),
            "database": connection.vendor,
            "counts": counts,
        }
        out.write(json.dumps(header) + "\n")
        dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
        for kind in kinds:
            fields = kind.fields
            names = ["kind", *(f.attname for f in fields)]
            dates = [i + 1 for i, f in enumerate(fields) if isinstance(f, models.DateTimeField)]
            done = 0
            source = kind.export_queryset() if kind.export_queryset else kind.model.objects
            rows = source.order_by("pk").values_list(*(f.attname for f in fields)).iterator(chunk_size=_BATCH)
            lines = []
            for values in rows:
                values = [kind.name, *values]
                for i in dates:
                    if values[i] is not None:
                        values[i] = values[i].isoformat()
                lines.append(dumps(dict(zip(names, values))))
                if len(lines) == _BATCH:
                    out.write("\n".join(lines) + "\n")
                    done += len(lines)
                    lines = []
                    if on_progress:
                        on_progress(kind.name, done, counts[kind.name])
            if lines:
                out.write("\n".join(lines) + "\n")
                done += len(lines)
            if on_progress:
                on_progress(kind.name, done, counts[kind.name])
    return counts


@dataclass
class _KindPlan:
    kind: TransferKind
    checkers: dict
    defaults: dict
    ids: dict = field(default_factory=dict)  # id -> line
    natural: dict = field(default_factory=dict)  # (label, value) -> (id, line)
    refs: dict = field(default_factory=dict)  # referenced id -> (line, field)
    rows: int = 0
    references: dict = field(default_factory=dict)  # attname -> kind name


@dataclass
class ImportReport:
    """Rows added and rows already present (left as they are), per kind."""

    added: dict
    present: dict
    dry_run: bool = False

    def as_dict(self):
        return {"added": dict(self.added), "present": dict(self.present), "dry_run": self.dry_run}


def _plans_defaults(kind):
    """attname -> function giving the value of a column a row leaves out (columns without one are required)."""
    defaults = {}
    for f in kind.fields:
        if f.has_default():
            defaults[f.attname] = f.get_default
        elif f.null:
            defaults[f.attname] = lambda: None
        elif isinstance(f, (models.CharField, models.TextField)) and f.blank:
            defaults[f.attname] = str
    return defaults


def _plans():
    return {
        kind.name: _KindPlan(
            kind=kind,
            checkers={f.attname: validation.field_checker(f) for f in kind.fields},
            defaults=_plans_defaults(kind),
            references=kind.references,
        )
        for kind in KINDS
    }


def _parse_line(text, lineno):
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportRejected([(lineno, "(line)", f"is not JSON: {exc.msg} at column {exc.colno}")]) from None
    except RecursionError:  # Python's parser recurses: a hostile file must be refused, not crash the import
        where = validation.nesting_path(text, "(line)")
        raise ImportRejected([(lineno, where, f"is nested deeper than {validation.MAX_JSON_DEPTH} levels")]) from None
    try:
        validation.check_json("(line)", data)  # what every database stores alike: no NUL, no lone surrogate
    except InvalidMemoryArgument as exc:
        raise ImportRejected(
            [(lineno, getattr(exc, "path", exc.field), getattr(exc, "problem", exc.message))]
        ) from None
    if not isinstance(data, dict):
        raise ImportRejected([(lineno, "(line)", "must be a JSON object")])
    return data


def _read_header(stream, fingerprint=None):
    first = stream.readline()
    if fingerprint is not None:
        fingerprint.update(first.encode())
    if not first.strip():
        raise ImportRejected([(1, "(header)", "the file is empty")])
    header = _parse_line(first, 1)
    if header.get("format") != FORMAT:
        raise ImportRejected([(1, "format", f"must be {FORMAT!r}; is this an Engram memory export?")])
    if header.get("version") != VERSION:
        raise ImportRejected(
            [(1, "version", f"version {header.get('version')!r} is not supported (expected {VERSION})")]
        )
    counts = header.get("counts")
    if not isinstance(counts, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in counts.values()):
        raise ImportRejected([(1, "counts", "must map each kind to its number of rows")])
    return header


def _rows(stream, fingerprint=None):
    """(line number, parsed object) of each non-blank line after the header."""
    for lineno, text in enumerate(stream, start=2):
        if fingerprint is not None:
            fingerprint.update(text.encode())
        if text.strip():
            yield lineno, _parse_line(text, lineno)


def _clean_row(data, lineno, plans, errors):
    """The row's kind plan and its cleaned column values, or (None, None) after noting errors."""
    name = data.get("kind")
    plan = plans.get(name)
    if plan is None:
        errors.append((lineno, "kind", f"unknown kind {name!r}; expected one of {', '.join(plans)}"))
        return None, None
    row, ok = {}, True
    for attname, check in plan.checkers.items():
        if attname in data:
            value, message = check(data[attname])
        elif attname in plan.defaults:
            value, message = plan.defaults[attname](), None
        else:
            value, message = None, "is missing"
        if message:
            errors.append((lineno, attname, message))
            ok = False
        row[attname] = value
    unknown = set(data) - set(plan.checkers) - {"kind"}
    if unknown:
        errors.append((lineno, sorted(unknown)[0], f"is not a column of {name}"))
        ok = False
    if ok and plan.kind.check:
        problem = plan.kind.check(row)
        if problem:
            errors.append((lineno, *problem))
            ok = False
    return (plan, row) if ok else (None, None)


def validate(stream, *, on_progress=None, fingerprint=None, allow_forgotten=False):
    """Pass 1: check every line; returns {kind: ids already in the database}. Raises ImportRejected.

    Rows of a forgotten person (memory/operations/tombstones.py) are refused unless `allow_forgotten`."""
    header = _read_header(stream, fingerprint)
    plans = _plans()
    errors = []
    last_line = 1
    for lineno, data in _rows(stream, fingerprint):
        last_line = lineno
        plan, row = _clean_row(data, lineno, plans, errors)
        if plan is not None:
            _note_identity(plan, row, lineno, errors)
        if len(errors) >= _MAX_ERRORS:
            raise ImportRejected(errors)
        if on_progress and lineno % _BATCH == 0:
            on_progress("validating", lineno)
    for name, plan in plans.items():
        expected = header["counts"].get(name, 0)
        if plan.rows != expected:
            errors.append((last_line, name, f"the header announces {expected} rows, the file holds {plan.rows}"))
    if errors:
        raise ImportRejected(errors)
    present = _check_against_database(plans, errors)
    if not allow_forgotten:
        errors += _forgotten(plans, present)
    if errors:
        raise ImportRejected(sorted(errors))
    return present


def _forgotten(plans, present):
    def new_rows(name):
        return [
            (value, pk_line) for (_, value), pk_line in plans[name].natural.items() if pk_line[0] not in present[name]
        ]

    users = {pk: (line, value[0]) for value, (pk, line) in new_rows("user")}
    identities = {value: line for value, (_pk, line) in new_rows("identity")}
    return tombstones.forgotten_rows(users, identities)


def _note_identity(plan, row, lineno, errors):
    plan.rows += 1
    pk = row["id"]
    if pk in plan.ids:
        errors.append((lineno, "id", f"{plan.kind.name} {pk} is already on line {plan.ids[pk]}"))
        return
    plan.ids[pk] = lineno
    for natural_key in plan.kind.natural_keys:
        value = natural_key.of_row(row)
        seen = plan.natural.get((natural_key, value))
        if seen is not None:
            errors.append(
                (
                    lineno,
                    natural_key.label,
                    f"{_show(value)} is already used by {plan.kind.name} {seen[0]} on line {seen[1]}",
                )
            )
        else:
            plan.natural[(natural_key, value)] = (pk, lineno)
    for attname, target in plan.references.items():
        ref = row[attname]
        if ref is not None:
            plan.refs.setdefault((target, ref), (lineno, attname))
    if plan.kind.row_references:
        for attname, target, ref in plan.kind.row_references(row):
            plan.refs.setdefault((target, ref), (lineno, attname))


def _check_against_database(plans, errors):
    """Ids already stored (left alone), natural keys taken by other rows, references to nowhere."""
    present = {}
    for name, plan in plans.items():
        model = plan.kind.model
        found = set()
        if plan.ids and model.objects.exists():
            for chunk in validation.chunks(plan.ids):
                found.update(model.objects.filter(pk__in=chunk).values_list("pk", flat=True))
            _check_natural_keys(plan, found, errors)
        present[name] = found
    file_ids = {name: plan.ids for name, plan in plans.items()}
    for plan in plans.values():
        missing = {}
        for (target, ref), where in plan.refs.items():
            if ref not in file_ids[target]:
                missing.setdefault(target, {})[ref] = where
        for target, refs in missing.items():
            model = plans[target].kind.model
            stored = set()
            for chunk in validation.chunks(refs):
                stored.update(model.objects.filter(pk__in=chunk).values_list("pk", flat=True))
            for ref, (lineno, attname) in sorted(refs.items(), key=lambda item: item[1][0]):
                if ref not in stored:
                    errors.append((lineno, attname, f"no {target} {ref} in the file or the database"))
    errors.sort()
    return present


def _show(value):
    return repr(value[0]) if len(value) == 1 else repr(value)


def _check_natural_keys(plan, present, errors):
    """A new row's natural key must not belong to another stored row."""
    for natural_key in plan.kind.natural_keys:
        new = {
            value: pk_line
            for (nk, value), pk_line in plan.natural.items()
            if nk == natural_key and pk_line[0] not in present
        }
        last = natural_key.columns[-1]
        for chunk in validation.chunks({value[-1] for value in new}):
            stored = plan.kind.model.objects.filter(**{f"{last}__in": chunk}).values_list(*natural_key.columns, "pk")
            for *value, pk in stored:
                hit = new.get(tuple(value))
                if hit is not None and hit[0] != pk:
                    errors.append(
                        (
                            hit[1],
                            natural_key.label,
                            f"{_show(tuple(value))} already belongs to {plan.kind.name} {pk} in the database",
                        )
                    )


def import_(stream, *, dry_run=False, on_progress=None, allow_forgotten=False):
    """Validate the whole stream, then insert its new rows in one transaction. Returns an ImportReport.

    `stream` must be seekable: pass 1 validates every line (and fingerprints the file), pass 2
    converts and inserts; if the file changed in between, the transaction is rolled back.
    ImportRejected names the line and field of each problem.
    """
    fingerprint = hashlib.sha256()
    present = validate(stream, on_progress=on_progress, fingerprint=fingerprint, allow_forgotten=allow_forgotten)
    stream.seek(0)
    again = hashlib.sha256()
    again.update(stream.readline().encode())
    added = {k.name: 0 for k in KINDS}
    report = ImportReport(added=added, present={k: len(v) for k, v in present.items()}, dry_run=dry_run)
    if dry_run:
        for _lineno, data in _rows(stream):
            if data["id"] not in present[data["kind"]]:
                added[data["kind"]] += 1
        return report
    conn = connections[DEFAULT_DB_ALIAS]
    inserters = {kind.name: _Inserter(kind, conn) for kind in KINDS}
    kinds = kinds_by_name()

    def flush(inserter):
        count = inserter.flush()
        if count:
            added[inserter.kind.name] += count
            if on_progress:
                on_progress(inserter.kind.name, added[inserter.kind.name])

    from ..backends import get_backend

    backend = get_backend()
    new_facts = []
    with transaction.atomic(), backend.bulk_load():
        for lineno, data in _rows(stream, fingerprint=again):
            inserter = inserters[data["kind"]]
            if data["id"] in present[data["kind"]]:
                continue
            inserter.add(data, lineno)
            if data["kind"] == "fact":
                new_facts.append(data["id"])
            if len(inserter.pending) >= _BATCH:
                if inserter.kind.late:  # what its rows point at goes in first
                    for other in inserters.values():
                        if not other.kind.late:
                            flush(other)
                flush(inserter)
        for inserter in sorted(inserters.values(), key=lambda i: i.kind.late):
            flush(inserter)
        if again.digest() != fingerprint.digest():
            raise ImportRejected([(0, "(file)", "the file changed while it was imported; nothing was written")])
        _reset_sequences([kinds[name].model for name, n in added.items() if n])
        if new_facts:
            # A file from before a fact's current state lived on its row lists it as a version.
            history.adopt_current_versions(new_facts)
    if added.get("fact"):
        backend.optimize()
    return report


class _Inserter:
    """Batches of one kind's rows, converted from validated JSON to database parameters.

    A hand-written INSERT rather than bulk_create: bulk_create gives auto_now / auto_now_add fields
    the time of the import, and an import must keep each row's own created and updated times.
    """

    def __init__(self, kind, conn):
        self.kind, self.conn = kind, conn
        self.fields = kind.fields
        self.stored = kind.stored_fields
        self.columns = [*self.stored, *(kind.model._meta.get_field(d) for d in kind.derived)]
        self.sql = (
            f"INSERT INTO {conn.ops.quote_name(kind.model._meta.db_table)} "
            f"({', '.join(conn.ops.quote_name(f.column) for f in self.columns)}) "
            f"VALUES ({', '.join(['%s'] * len(self.columns))})"
        )
        self.defaults = _plans_defaults(kind)
        self.adapters = [self._adapter(f) for f in self.stored]
        self.pending, self.lines = [], []
        self.workspace_id = current_workspace_id()

    def _adapter(self, f):
        ops = self.conn.ops
        if isinstance(f, models.DateTimeField):
            return lambda v: None if v is None else ops.adapt_datetimefield_value(datetime.fromisoformat(v))
        if isinstance(f, models.JSONField):
            return lambda v: None if v is None else ops.adapt_json_value(v, f.encoder)
        return None  # strings, numbers, booleans and ids go to the driver as they are

    def add(self, data, lineno):
        row = {}
        for f in self.fields:
            name = f.attname
            row[name] = data[name] if name in data else self.defaults[name]()
        if self.workspace_id is not None and "workspace_id" in row:
            row["workspace_id"] = self.workspace_id  # an import inside a workspace is that workspace's
        if self.kind.prepare:
            self.kind.prepare(row)
        self.pending.append(row)
        self.lines.append(lineno)

    def _params(self, row):
        params = [
            row[f.attname] if adapt is None else adapt(row[f.attname]) for f, adapt in zip(self.stored, self.adapters)
        ]
        return params + [row[d] for d in self.kind.derived]

    def flush(self):
        if not self.pending:
            return 0
        rows = self.kind.to_stored(self.pending, self.lines) if self.kind.to_stored else self.pending
        try:
            with self.conn.cursor() as cursor:
                cursor.executemany(self.sql, [self._params(row) for row in rows])
        except IntegrityError as exc:
            span = f"{self.lines[0]}-{self.lines[-1]}"
            raise ImportRejected([(span, self.kind.name, f"the database refused these rows: {exc}")]) from exc
        count = len(self.pending)
        self.pending, self.lines = [], []
        return count


def _reset_sequences(models_):
    """After inserts with explicit ids, the next automatic id must come after them (PostgreSQL sequences)."""
    if not models_:
        return
    statements = connection.ops.sequence_reset_sql(no_style(), models_)
    if statements:
        with connection.cursor() as cursor:
            for statement in statements:
                cursor.execute(statement)
