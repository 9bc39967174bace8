"""What export and import carry: one TransferKind per table, with the checks and preparation of its rows.

Other apps add kinds of their own with `register_kind` (MemoryService re-exports it as
`register_transfer_kind`); memory/operations/transfer.py reads and writes them.
"""

from collections.abc import Callable
from dataclasses import dataclass

from django.db import (
    models,
)
from django.db.models import Case, F, Value, When
from django.db.models.functions import Coalesce

from ..domain.store_items import check_imported_item, prepare_imported_item
from ..exceptions import ImportRejected, InvalidMemoryArgument
from ..models import (
    ChannelIdentity,
    Episode,
    Fact,
    FactAction,
    FactVersion,
    MemoryRelation,
    MemoryUser,
    Procedure,
    Promotion,
    RecallDocument,
    RecallKind,
    Relation,
    Scope,
    StoreItem,
    Team,
    TeamMember,
)
from ..models.owners import owner_key
from ..models.workspaces import scoped
from ..rules import validation, workspaces
from ..text import episode_concepts, fact_concepts, fact_search_text

FORMAT, VERSION = "engram-memory", 1


@dataclass(frozen=True)
class NaturalKey:
    """A unique column group besides the id: its label in errors, its stored columns, its value in a row."""

    label: str
    columns: tuple
    of_row: Callable


@dataclass(frozen=True)
class TransferKind:
    """One exported table. `derived`: columns rebuilt on import; `natural_keys`: unique column groups
    (NaturalKey); `check`: extra row rules, returning (field, message) or None;
    `prepare`: fills derived columns of a validated row before insert.

    A table whose file rows are not its stored columns (the memory graph's edges name memories, not
    recall documents) gives `file_fields` (unbound model fields: the file's columns, validated as
    such), `export_queryset` (annotated with those names), `row_references` (row -> [(field, kind
    name, id)] it points at) and `to_stored` ((rows, lines) -> stored rows, for a batch, run
    after every other kind's rows are in: `late`).
    """

    name: str
    model: type
    derived: tuple = ()
    natural_keys: tuple = ()
    check: Callable | None = None
    prepare: Callable | None = None
    file_fields: tuple = ()
    export_queryset: Callable | None = None
    row_references: Callable | None = None
    to_stored: Callable | None = None

    @property
    def late(self):
        return self.to_stored is not None

    @property
    def fields(self):
        """The file's columns."""
        return list(self.file_fields) if self.file_fields else self.stored_fields

    @property
    def stored_fields(self):
        return [
            f
            for f in self.model._meta.concrete_fields
            if not getattr(f, "generated", False) and f.attname not in self.derived
        ]

    @property
    def references(self):
        """attname -> kind name of each foreign key."""
        by_model = {k.model: k.name for k in KINDS}
        return {
            f.attname: by_model[f.related_model] for f in self.fields if f.is_relation and f.related_model in by_model
        }


def _fact_owner(row):
    return owner_key(
        row.get("scope"),
        user_id=row.get("user_id"),
        agent_id=row.get("agent_id"),
        session_id=row.get("session_id"),
        team_id=row.get("team_id"),
    )


def _check_fact(row):
    scope = row["scope"]
    owners = {
        "session_id": bool(row["session_id"]),
        "user_id": row["user_id"] is not None,
        "agent_id": bool(row["agent_id"]),
        # A file from before teams has no team_id: no team.
        "team_id": row.get("team_id") is not None,
    }
    wanted = {
        Scope.SESSION: "session_id",
        Scope.USER: "user_id",
        Scope.AGENT: "agent_id",
        Scope.TEAM: "team_id",
    }.get(scope)
    for name, present in owners.items():
        if present != (name == wanted):
            return name, f"a {scope} fact {'needs' if name == wanted else 'cannot have'} {name}"
    if not row["key"].strip():
        return "key", "must not be blank"
    if row.get("change_action") == FactAction.DELETED:
        return "change_action", "a stored fact's current change cannot be a delete"
    return validation.problem_of(
        lambda: validation.check_unit_interval("confidence", row["confidence"]),
        lambda: _check_stored_tags(row.get("tags", [])),
    )


def _check_stored_tags(tags):
    """Tags as set_fact stores them: check_tags would leave them as they are."""
    if validation.check_tags("tags", tags) != tags:
        raise InvalidMemoryArgument("tags", "must be lower-case labels without duplicates, as set_fact stores them")


def _prepare_fact(row):
    row["search_text"] = fact_search_text(row["key"], row["value"])
    row["concepts"] = fact_concepts(row["key"], row["value"])


def _prepare_episode(row):
    row["concepts"] = episode_concepts(row["summary"], row["conversation"])


def _check_version(row):
    problem = _check_fact(row)
    if problem is None and row["fact_id"] <= 0:
        return "fact_id", "must be a positive fact id"
    return problem


def _prepare_version(row):
    row["scope_key"] = _fact_owner(row)


def _check_team(row):
    if not row["name"].strip():
        return "name", "must not be blank"
    return None


def _check_team_member(row):
    if not row["agent_id"].strip():
        return "agent_id", "must not be blank"
    return None


def _check_identity(row):
    if not row["channel"] or not row["external_id"]:
        return ("channel" if not row["channel"] else "external_id"), "must not be blank"
    return None


def _check_user(row):
    if row["merged_into_id"] is not None and row["merged_into_id"] == row["id"]:
        return "merged_into_id", "a user cannot be merged into itself"
    return None


def _check_procedure(row):
    if not row["name"]:
        return "name", "must not be blank"
    return validation.problem_of(lambda: validation.check_unit_interval("success_rate", row["success_rate"]))


def _check_promotion(row):
    if row["source_id"] <= 0:
        return "source_id", "must be a positive id"
    ids = row["fact_ids"]
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in ids):
        return "fact_ids", "must be a list of positive fact ids"
    return None


# The memory graph's edges name the memories they join (recall documents are derived rows whose
# ids mean nothing in another database): a `contradicts` edge's target is a fact version.
VERSION_TARGET = "fact_version"


def _relation_file_fields():
    kinds = RecallKind.choices
    fields = {
        "id": models.BigIntegerField(),
        "source_kind": models.CharField(max_length=16, choices=kinds),
        "source_item": models.BigIntegerField(),
        "target_kind": models.CharField(max_length=16, choices=[*kinds, (VERSION_TARGET, "Fact version")]),
        "target_item": models.BigIntegerField(),
        "relation": models.CharField(max_length=16, choices=Relation.choices),
        "weight": models.FloatField(default=1.0),
        "created_at": models.DateTimeField(),
    }
    for name, f in fields.items():
        f.set_attributes_from_name(name)
    return tuple(fields.values())


def _relation_export():
    return scoped(MemoryRelation.objects.all(), workspaces.relations_of).annotate(
        source_kind=F("source__kind"),
        source_item=F("source__item_id"),
        target_kind=Case(
            When(target_version__isnull=False, then=Value(VERSION_TARGET)),
            default=F("target__kind"),
            output_field=models.CharField(),
        ),
        target_item=Coalesce("target_version_id", "target__item_id"),
    )


def _check_relation(row):
    for name in ("id", "source_item", "target_item"):
        if row[name] <= 0:
            return name, "must be a positive id"
    contradicts = row["relation"] == Relation.CONTRADICTS
    if contradicts != (row["target_kind"] == VERSION_TARGET):
        return "target_kind", "a contradicts edge, and only one, points at a fact_version"
    if contradicts and row["source_kind"] != RecallKind.FACT:
        return "source_kind", "a contradicts edge starts at a fact"
    if (row["source_kind"], row["source_item"]) == (row["target_kind"], row["target_item"]):
        return "target_item", "an edge cannot join a memory to itself"
    # The weight is only checked finite: a `similar` edge's is a float32 cosine, which may round past 1.
    return None


def _relation_references(row):
    return [
        ("source_item", row["source_kind"], row["source_item"]),
        ("target_item", row["target_kind"], row["target_item"]),
    ]


def _relation_rows(rows, lines):
    """Stored rows of a batch of edges: each memory named by kind and id becomes its recall document."""
    wanted = {}
    for row in rows:
        wanted.setdefault(row["source_kind"], set()).add(row["source_item"])
        if row["target_kind"] != VERSION_TARGET:
            wanted.setdefault(row["target_kind"], set()).add(row["target_item"])
    docs = {}
    for kind, items in wanted.items():
        for chunk in validation.chunks(sorted(items)):
            found = RecallDocument.objects.filter(kind=kind, item_id__in=chunk).values_list("item_id", "id")
            docs.update({(kind, item): pk for item, pk in found})
    stored = []
    for row, lineno in zip(rows, lines):
        source = docs.get((row["source_kind"], row["source_item"]))
        version = row["target_kind"] == VERSION_TARGET
        target = None if version else docs.get((row["target_kind"], row["target_item"]))
        if source is None or (target is None and not version):
            missing = "source_item" if source is None else "target_item"
            raise ImportRejected([(lineno, missing, "names a memory without a recall document")])
        stored.append(
            {
                "id": row["id"],
                "source_id": source,
                "target_id": target,
                "target_version_id": row["target_item"] if version else None,
                "relation": row["relation"],
                "weight": row["weight"],
                "created_at": row["created_at"],
            }
        )
    return stored


# Export order: a row's references come before it where the schema allows (inserts defer foreign
# key checks to the commit anyway, so files in another order import too).
KINDS = [
    TransferKind(
        "user",
        MemoryUser,
        check=_check_user,
        natural_keys=(NaturalKey("canonical_id", ("canonical_id",), lambda r: (r["canonical_id"],)),),
    ),
    TransferKind(
        "identity",
        ChannelIdentity,
        check=_check_identity,
        natural_keys=(
            NaturalKey("channel, external_id", ("channel", "external_id"), lambda r: (r["channel"], r["external_id"])),
        ),
    ),
    TransferKind("episode", Episode, derived=("concepts",), prepare=_prepare_episode),
    TransferKind(
        "procedure",
        Procedure,
        check=_check_procedure,
        natural_keys=(NaturalKey("agent_id, name", ("agent_id", "name"), lambda r: (r["agent_id"], r["name"])),),
    ),
    TransferKind(
        "team",
        Team,
        check=_check_team,
        natural_keys=(NaturalKey("name", ("name",), lambda r: (r["name"],)),),
    ),
    TransferKind(
        "team_member",
        TeamMember,
        check=_check_team_member,
        natural_keys=(
            NaturalKey("agent_id, team_id", ("agent_id", "team_id"), lambda r: (r["agent_id"], r["team_id"])),
        ),
    ),
    TransferKind(
        "fact",
        Fact,
        derived=("search_text", "concepts"),
        check=_check_fact,
        prepare=_prepare_fact,
        natural_keys=(NaturalKey("scope, owner, key", ("scope_key", "key"), lambda r: (_fact_owner(r), r["key"])),),
    ),
    # A version names its fact by number only (a deleted fact's versions have no fact row to point at).
    TransferKind(
        "fact_version",
        FactVersion,
        derived=("scope_key",),
        check=_check_version,
        prepare=_prepare_version,
    ),
    # A promotion names its source by number (the source may be deleted later; the ledger stays).
    TransferKind(
        "promotion",
        Promotion,
        check=_check_promotion,
        export_queryset=lambda: scoped(Promotion.objects.all(), workspaces.promotions_of),
        natural_keys=(
            NaturalKey(
                "source_kind, source_id", ("source_kind", "source_id"), lambda r: (r["source_kind"], r["source_id"])
            ),
        ),
    ),
    TransferKind(
        "relation",
        MemoryRelation,
        check=_check_relation,
        file_fields=_relation_file_fields(),
        export_queryset=_relation_export,
        row_references=_relation_references,
        to_stored=_relation_rows,
    ),
]


def register_kind(kind, *, before=None):
    """Add a table to export and import (before the kind named `before`, else last)."""
    if any(k.name == kind.name for k in KINDS):
        raise ValueError(f"transfer kind {kind.name!r} is already registered")
    index = next((i for i, k in enumerate(KINDS) if k.name == before), len(KINDS))
    KINDS.insert(index, kind)


def kinds_by_name():
    return {k.name: k for k in KINDS}


# LangGraph store items travel with the memory (their vectors do not: see prepare_imported_item).
register_kind(
    TransferKind(
        "store_item",
        StoreItem,
        derived=("embedding",),
        check=check_imported_item,
        prepare=prepare_imported_item,
        natural_keys=(NaturalKey("namespace, key", ("namespace", "key"), lambda r: (r["namespace"], r["key"])),),
    )
)
