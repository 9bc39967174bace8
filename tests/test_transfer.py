"""Export, clear and import: a round trip reproduces every row; a bad file is refused whole, naming line and field."""

import io
import json

import pytest

from memory.exceptions import ImportRejected, InvalidMemoryArgument
from memory.models import ChannelIdentity, ConsolidationRun, Episode, Fact, FactVersion, MemoryUser, Procedure

pytestmark = pytest.mark.django_db

MODELS = [MemoryUser, ChannelIdentity, Episode, Procedure, Fact, FactVersion]


def snapshot():
    """Every column of every memory row (generated and derived ones included), by table and id."""
    return {
        model.__name__: [
            tuple(getattr(row, f.attname) for f in model._meta.concrete_fields) for row in model.objects.order_by("pk")
        ]
        for model in MODELS
    }


@pytest.fixture
def store(service, user_factory):
    """A small store with every kind of row and relation."""
    ada, bob, old = user_factory("ada"), user_factory("bob"), user_factory("old-ada")
    service.link_identity(ada.pk, "email", "ada@example.org")
    episode = service.start_episode(agent_id="planner", user_id=ada.pk, session_id="s1", trigger_input={"text": "hi"})
    service.add_message(episode.pk, "user", "My favourite colour is green.")
    service.add_action(episode.pk, {"tool": "recall", "result": ["nothing"]})
    service.complete_episode(episode.pk, success=True, final_output={"reply": "ok"}, summary="greeted")
    service.start_episode(agent_id="planner")  # still running
    service.set_fact(
        "favourite_colour",
        "green",
        scope="user",
        user_id=ada.pk,
        fact_type="user_preference",
        source_episode_id=episode.pk,
        provenance="consolidation",
    )
    service.set_fact("favourite_colour", "green", scope="user", user_id=ada.pk)  # confirmed
    service.set_fact("timezone", {"name": "Europe/Lisbon", "offset": 0}, scope="agent", agent_id="planner")
    service.set_fact("draft", ["a", 1, None, 2.5], scope="session", session_id="s1", confidence=0.35)
    office = service.set_fact("office_city", "Porto ünïcode ✓", tags=["office", "travel"]).fact
    service.pin_memories("fact", [office.pk])
    service.set_fact("pet", "cat", scope="user", user_id=old.pk)
    service.merge_users(old.pk, ada.pk)
    service.get_fact("office_city")
    service.flush_access_counts()
    parent = service.save_procedure(
        "weather", trigger_conditions={"goal_contains": ["weather"]}, content={"prompt": "city?"}
    )
    service.record_procedure_use(parent.pk, success=True, duration_ms=120)
    service.save_procedure("weather_v2", agent_id="planner", parent_id=parent.pk, source="evolved", is_active=False)
    return {"ada": ada, "bob": bob, "episode": episode}


def export_text(service):
    out = io.StringIO()
    service.export_memories(out)
    return out.getvalue()


def test_export_is_a_header_then_one_object_per_row(service, store):
    lines = export_text(service).splitlines()
    header = json.loads(lines[0])
    assert header["format"] == "engram-memory" and header["version"] == 1
    assert header["counts"] == {
        "user": 3,
        "identity": 4,
        "episode": 2,
        "procedure": 2,
        "team": 0,
        "team_member": 0,
        "fact": 5,
        "fact_version": 1,  # the replaced value; each fact's current version is its row
        "store_item": 0,
        "promotion": 0,
        "relation": 0,
        "reminder": 0,
    }
    rows = [json.loads(line) for line in lines[1:]]
    assert len(rows) == 17
    fact = next(r for r in rows if r["kind"] == "fact" and r["key"] == "timezone")
    assert fact["value"] == {"name": "Europe/Lisbon", "offset": 0}
    assert "scope_key" not in fact and "search_text" not in fact  # derived: rebuilt on import


def test_export_clear_import_reproduces_every_row(service, store):
    before = snapshot()
    text = export_text(service)
    deleted = service.clear_memories()
    assert deleted == {"facts": 5, "episodes": 2, "procedures": 2, "identities": 4, "users": 3}
    assert all(model.objects.count() == 0 for model in MODELS)
    report = service.import_memories(io.StringIO(text))
    assert report.added == {
        "user": 3,
        "identity": 4,
        "episode": 2,
        "procedure": 2,
        "team": 0,
        "team_member": 0,
        "fact": 5,
        "fact_version": 1,  # the replaced value; each fact's current version is its row
        "store_item": 0,
        "promotion": 0,
        "relation": 0,
        "reminder": 0,
    }
    assert snapshot() == before
    # the search index follows the imported rows, and the lookups still resolve merged users
    ada = store["ada"]
    assert [f.key for f in service.search_facts("green", user_id=ada.pk)] == ["favourite_colour"]
    assert [f.key for f in service.search_facts("ünïcode")] == ["office_city"]
    assert service.get_fact("pet", user_id=MemoryUser.objects.get(canonical_id="test:old-ada").pk).value == "cat"
    # new rows get ids after the imported ones (PostgreSQL sequences were moved on)
    new = service.set_fact("after_import", True).fact
    assert new.pk > max(row[0] for row in before["Fact"])
    assert [f.key for f in service.search_facts("after import")] == ["after_import"]  # indexing still per row
    user, _ = service.get_or_create_user("test", "zed")
    assert user.pk > max(row[0] for row in before["MemoryUser"])


@pytest.mark.django_db(transaction=True)
def test_the_round_trip_commits_with_every_foreign_key_checked(service, store):
    """Foreign keys are checked at commit; here the import really commits (no test transaction around it)."""
    before = snapshot()
    text = export_text(service)
    service.clear_memories()
    service.import_memories(io.StringIO(text))
    assert snapshot() == before


def test_importing_the_same_file_twice_adds_nothing(service, store):
    text = export_text(service)
    before = snapshot()
    report = service.import_memories(io.StringIO(text))
    assert sum(report.added.values()) == 0
    assert report.present == {
        "user": 3,
        "identity": 4,
        "episode": 2,
        "procedure": 2,
        "team": 0,
        "team_member": 0,
        "fact": 5,
        "fact_version": 1,  # the replaced value; each fact's current version is its row
        "store_item": 0,
        "promotion": 0,
        "relation": 0,
        "reminder": 0,
    }
    assert snapshot() == before


def test_a_partial_clear_then_import_restores_what_was_cleared(service, store):
    before = snapshot()
    text = export_text(service)
    service.clear_memories(["facts"], scope="user")
    report = service.import_memories(io.StringIO(text))
    assert report.added["fact"] == 2 and report.added["user"] == 0
    assert snapshot() == before


def test_a_dry_run_writes_nothing(service, store):
    text = export_text(service)
    service.clear_memories()
    report = service.import_memories(io.StringIO(text), dry_run=True)
    assert report.added["fact"] == 5
    assert Fact.objects.count() == 0


# ------------------------------------------------------------------ malformed files


def edit(text, line, change):
    lines = text.splitlines()
    lines[line - 1] = change(lines[line - 1])
    return "\n".join(lines) + "\n"


def set_field(name, value):
    def change(line):
        row = json.loads(line)
        row[name] = value
        return json.dumps(row)

    return change


def line_of(text, kind, **match):
    for n, line in enumerate(text.splitlines(), start=1):
        row = json.loads(line)
        if row.get("kind") == kind and all(row.get(k) == v for k, v in match.items()):
            return n
    raise AssertionError(f"no {kind} {match}")


@pytest.fixture
def exported(service, store):
    text = export_text(service)
    service.clear_memories()
    return text


def rejected(service, text):
    with pytest.raises(ImportRejected) as info:
        service.import_memories(io.StringIO(text))
    assert all(model.objects.count() == 0 for model in MODELS), "a rejected import wrote rows"
    return info.value


def test_a_line_that_is_not_json_is_named(service, exported):
    n = line_of(exported, "fact", key="timezone")
    error = rejected(service, edit(exported, n, lambda line: line[:-5]))
    assert error.errors[0][0] == n and "is not JSON" in str(error)


@pytest.mark.parametrize(
    "hostile, message",
    [
        ('{"kind": "fact", "value": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper"),
        ('{"kind": "fact", "key": "a\\u0000b"}', "NUL"),
        ('{"kind": "fact", "key": "a\\ud800b"}', "surrogate"),
    ],
)
def test_a_hostile_line_is_refused_naming_it(service, exported, hostile, message):
    """Nesting that would overflow Python's parser, and text no database stores alike, are refused
    with the line named: the import writes nothing (it used to crash with RecursionError)."""
    n = line_of(exported, "fact", key="timezone")
    error = rejected(service, edit(exported, n, lambda line: hostile))
    assert error.errors[0][0] == n and message in str(error)


@pytest.mark.parametrize("levels", [70, 5000])  # under and over the depth Python's own parser reaches
def test_a_line_nested_too_deep_names_the_field(service, exported, levels):
    n = line_of(exported, "fact", key="timezone")
    hostile = '{"kind": "fact", "value": {"notes": ' + "[" * levels + "1" + "]" * levels + "}}"
    error = rejected(service, edit(exported, n, lambda line: hostile))
    assert error.errors[0] == (n, "(line).value.notes", "is nested deeper than 64 levels")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("confidence", 7, "must be from 0 to 1"),
        ("confidence", "high", "must be a finite number"),
        ("scope", "crew", "must be one of"),
        ("created_at", "yesterday", "is not an ISO 8601 timestamp"),
        ("created_at", "2024-01-01T10:00:00", "must carry a UTC offset"),
        ("created_at", "9999-12-31T23:59:59.999999-14:00", "is out of range"),  # year 10000 in UTC
        ("created_at", "0001-01-01T00:00:00+14:00", "is out of range"),
        ("key", "", "must not be blank"),
        ("agent_id", "planner-2", "a user fact cannot have agent_id"),
        ("user_id", 9999, "no user 9999 in the file or the database"),
        ("times_confirmed", -1, "must be positive"),
        ("tags", ["Travel"], "must be lower-case labels"),
        ("tags", "travel", "must be a list"),
        ("colour", "green", "is not a column of fact"),
    ],
)
def test_a_bad_field_is_named_with_its_line_and_nothing_is_written(service, exported, field, value, message):
    n = line_of(exported, "fact", key="favourite_colour")
    error = rejected(service, edit(exported, n, set_field(field, value)))
    assert (error.errors[0][0], error.errors[0][1]) == (n, field), error.errors
    assert message in error.errors[0][2]
    assert str(error).startswith(f"line {n}: {field}: ")


def test_a_missing_column_without_a_default_is_named(service, exported):
    n = line_of(exported, "fact", key="timezone")
    error = rejected(
        service, edit(exported, n, lambda line: json.dumps({k: v for k, v in json.loads(line).items() if k != "key"}))
    )
    assert error.errors[0][:2] == (n, "key") and "is missing" in error.errors[0][2]


def test_a_cut_off_file_is_refused(service, exported):
    error = rejected(service, "\n".join(exported.splitlines()[:-2]) + "\n")
    assert "fact: the header announces 5 rows, the file holds 4" in str(error)


def test_duplicates_in_the_file_are_refused(service, exported):
    lines = exported.splitlines()
    n = line_of(exported, "fact", key="timezone")
    error = rejected(service, "\n".join(lines + [lines[n - 1]]).replace('"fact":5', '"fact":6') + "\n")
    assert "is already on line" in str(error)
    copy = json.loads(lines[n - 1])
    copy["id"] = 777
    error = rejected(service, "\n".join(lines + [json.dumps(copy)]).replace('"fact":5', '"fact":6') + "\n")
    assert error.errors[0][1] == "scope, owner, key" and "already used by fact" in error.errors[0][2]


def test_a_natural_key_held_by_another_stored_row_is_refused(service, exported):
    service.set_fact("timezone", "UTC", scope="agent", agent_id="planner")  # same owner and key, new id
    n = line_of(exported, "fact", key="timezone")
    with pytest.raises(ImportRejected) as info:
        service.import_memories(io.StringIO(exported))
    assert info.value.errors[0][:2] == (n, "scope, owner, key")
    assert "already belongs to fact" in info.value.errors[0][2]
    assert Fact.objects.count() == 1 and MemoryUser.objects.count() == 0


@pytest.mark.parametrize(
    "text, field",
    [
        ("", "(header)"),
        ('{"format": "something-else"}\n', "format"),
        ('{"format": "engram-memory", "version": 99, "counts": {}}\n', "version"),
        ('["not", "an", "object"]\n', "(line)"),
    ],
)
def test_a_bad_header_is_refused(service, text, field):
    error = rejected(service, text)
    assert error.errors[0][:2] == (1, field)


def test_an_unknown_kind_is_refused(service, exported):
    error = rejected(service, exported + '{"kind": "mood", "id": 1}\n')
    assert error.errors[0][1] == "kind" and "unknown kind 'mood'" in error.errors[0][2]


# ------------------------------------------------------------------ clear


def test_clear_by_scope_agent_and_user(service, store):
    ada, bob = store["ada"], store["bob"]
    service.set_fact("bob_fact", 1, scope="user", user_id=bob.pk)
    assert service.clear_memories(scope="session") == {"facts": 1}
    assert service.clear_memories(agent_id="planner") == {"facts": 1, "episodes": 2, "procedures": 1}
    assert Procedure.objects.get().name == "weather"
    deleted = service.clear_memories(user_id=ada.pk)
    assert deleted == {"facts": 2, "episodes": 0, "identities": 3, "users": 2}  # ada and the user merged into her
    assert set(Fact.objects.values_list("key", flat=True)) == {"office_city", "bob_fact"}
    assert set(MemoryUser.objects.values_list("pk", flat=True)) == {bob.pk}


def test_clearing_episodes_keeps_the_facts_distilled_from_them(service, store):
    service.clear_memories(["episodes"])
    fact = Fact.objects.get(key="favourite_colour")
    assert fact.source_episode_id is None and fact.provenance == "consolidation"


def test_clear_leaves_consolidation_records(service, store):
    service.consolidate()
    service.clear_memories()
    assert ConsolidationRun.objects.count() == 1


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"kinds": ["moods"]}, "kinds"),
        ({"kinds": ["procedures"], "user_id": None, "scope": "user"}, "scope"),
        ({"kinds": ["users"], "agent_id": "planner"}, "agent_id"),
        ({"scope": "crew"}, "scope"),
        ({"scope": "user", "agent_id": "planner"}, "scope"),
    ],
)
def test_clear_refuses_filters_that_do_not_apply(service, store, kwargs, field):
    before = snapshot()
    kinds = kwargs.pop("kinds", None)
    with pytest.raises(InvalidMemoryArgument) as info:
        service.clear_memories(kinds, **kwargs)
    assert info.value.field == field
    assert snapshot() == before


class ChangingFile(io.StringIO):
    """A file someone edits between the validation pass and the insert pass."""

    def __init__(self, first, second):
        super().__init__(first)
        self.second = second

    def seek(self, *args):
        if self.second is not None:
            self.__init__(self.second, None)
        return super().seek(*args)


def test_a_file_changed_between_the_passes_writes_nothing(service, exported):
    n = line_of(exported, "fact", key="timezone")
    changed = edit(exported, n, set_field("value", "edited"))
    with pytest.raises(ImportRejected, match="the file changed while it was imported"):
        service.import_memories(ChangingFile(exported, changed))
    assert all(model.objects.count() == 0 for model in MODELS)
    # the search index keeps indexing new facts row by row
    service.set_fact("written_after", "a rolled back import")
    assert [f.key for f in service.search_facts("rolled back")] == ["written_after"]
