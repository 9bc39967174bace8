"""Promotions and the memory graph in `memory export` / `memory import`: round trips, and bad rows named."""

import io
import json

import pytest
from django.utils import timezone
from test_relations import words  # noqa: F401  (the fixture: a bag-of-words embedder, no model)

from memory.exceptions import ImportRejected
from memory.learning.consolidation import BaseExtractor, ExtractedFact
from memory.models import Fact, FactVersion, MemoryRelation, MemoryUser, Promotion, Scope
from memory.recall.upkeep import flush_buffers

pytestmark = pytest.mark.django_db


class TeaExtractor(BaseExtractor):
    def extract(self, episode):
        return [ExtractedFact(key="drink", value="green tea", fact_type="user_preference")]


@pytest.fixture
def graph(service, user_factory, keyword_only, django_capture_on_commit_callbacks):
    """A contradicts edge (a replaced value), a supports edge (consolidation), a promotion."""
    ann = user_factory("ann")
    city = service.set_fact("city", "Porto", scope="user", user_id=ann.pk).fact
    with django_capture_on_commit_callbacks(execute=True):
        service.set_fact("city", "Lisbon", scope="user", user_id=ann.pk)
    episode = service.record_episode(started_at=timezone.now(), success=True, user_id=ann.pk, summary="tea talk")
    service.consolidate(extractor=TeaExtractor())
    service.set_fact("favourite_snack", "figs", scope=Scope.SESSION, session_id="s1", fact_type="user_preference")
    for _ in range(3):
        assert service.recall("favourite snack", agent_id="helper", user_id=ann.pk, session_id="s1")
    assert service.promote().promoted
    flush_buffers()  # what the end of the request that wrote them would write
    assert MemoryRelation.objects.count() == 2 and Promotion.objects.count() == 1
    return {"ann": ann, "city": city, "episode": episode}


def promotions():
    return [
        tuple(getattr(p, f.attname) for f in Promotion._meta.concrete_fields) for p in Promotion.objects.order_by("pk")
    ]


def edges():
    """Each edge by the memories it joins (document ids are rebuilt by an import)."""
    return [
        (
            e.pk,
            e.source.kind,
            e.source.item_id,
            e.relation,
            e.target.kind if e.target else None,
            e.target.item_id if e.target else None,
            e.target_version_id,
            e.weight,
            e.created_at,
        )
        for e in MemoryRelation.objects.select_related("source", "target").order_by("pk")
    ]


def export_text(service):
    out = io.StringIO()
    service.export_memories(out)
    return out.getvalue()


def line_of(text, kind, **match):
    for n, line in enumerate(text.splitlines(), start=1):
        row = json.loads(line)
        if row.get("kind") == kind and all(row.get(k) == v for k, v in match.items()):
            return n, row
    raise AssertionError(f"no {kind} {match}")


def test_export_names_each_edge_by_its_memories(service, graph):
    text = export_text(service)
    counts = json.loads(text.splitlines()[0])["counts"]
    assert (counts["promotion"], counts["relation"]) == (1, 2)
    replaced = FactVersion.objects.get(fact_id=graph["city"].pk, value="Porto")
    _, row = line_of(text, "relation", relation="contradicts")
    assert {k: row[k] for k in ("source_kind", "source_item", "target_kind", "target_item")} == {
        "source_kind": "fact",
        "source_item": graph["city"].pk,
        "target_kind": "fact_version",
        "target_item": replaced.pk,
    }
    _, row = line_of(text, "relation", relation="supports")
    assert (row["target_kind"], row["target_item"]) == ("episode", graph["episode"].pk)
    assert "source_id" not in row and "target_id" not in row  # document ids mean nothing elsewhere


def test_export_clear_import_reproduces_promotions_and_edges(service, graph):
    before_promotions, before_edges = promotions(), edges()
    relations_of_city = service.memory_relations("fact", graph["city"].pk)
    text = export_text(service)
    service.clear_memories()
    assert not Promotion.objects.exists() and not MemoryRelation.objects.exists()
    report = service.import_memories(io.StringIO(text))
    assert (report.added["promotion"], report.added["relation"]) == (1, 2)
    assert promotions() == before_promotions
    assert edges() == before_edges
    assert service.memory_relations("fact", graph["city"].pk) == relations_of_city
    # Again: nothing added, nothing changed.
    report = service.import_memories(io.StringIO(text))
    assert (report.added["promotion"], report.added["relation"]) == (0, 0)
    assert (report.present["promotion"], report.present["relation"]) == (1, 2)
    assert edges() == before_edges
    # The ledger still keeps the source from being promoted twice.
    service.recall("favourite snack", agent_id="helper", user_id=graph["ann"].pk, session_id="s1")
    assert service.promote().promoted == []


@pytest.mark.django_db(transaction=True)
def test_the_round_trip_commits_with_every_foreign_key_checked(service, graph):
    before = edges()
    text = export_text(service)
    service.clear_memories()
    service.import_memories(io.StringIO(text))
    assert edges() == before and Promotion.objects.count() == 1


@pytest.mark.parametrize(
    "kind, match, field, value, message",
    [
        ("relation", {"relation": "supports"}, "relation", "likes", "must be one of"),
        ("relation", {"relation": "supports"}, "target_kind", "fact_version", "only one, points at a fact_version"),
        ("relation", {"relation": "supports"}, "source_item", 9999, "no fact 9999 in the file or the database"),
        ("relation", {"relation": "supports"}, "target_item", 9999, "no episode 9999 in the file or the database"),
        ("relation", {"relation": "contradicts"}, "target_item", 9999, "no fact_version 9999"),
        ("relation", {"relation": "contradicts"}, "source_kind", "episode", "a contradicts edge starts at a fact"),
        ("relation", {"relation": "supports"}, "weight", "heavy", "must be a finite number"),
        ("relation", {"relation": "supports"}, "source_id", 1, "is not a column of relation"),
        ("promotion", {}, "rule", "magic", "must be one of"),
        ("promotion", {}, "fact_ids", ["7"], "must be a list of positive fact ids"),
        ("promotion", {}, "user_id", 9999, "no user 9999 in the file or the database"),
        ("promotion", {}, "source_id", 0, "must be a positive id"),
    ],
)
def test_a_bad_row_is_named_with_its_line_and_nothing_is_written(service, graph, kind, match, field, value, message):
    text = export_text(service)
    service.clear_memories()
    n, row = line_of(text, kind, **match)
    lines = text.splitlines()
    lines[n - 1] = json.dumps({**row, field: value})
    with pytest.raises(ImportRejected) as info:
        service.import_memories(io.StringIO("\n".join(lines) + "\n"))
    assert (info.value.errors[0][0], info.value.errors[0][1]) == (n, field), info.value.errors
    assert message in info.value.errors[0][2]
    assert not MemoryUser.objects.exists() and not Fact.objects.exists() and not MemoryRelation.objects.exists()


def test_a_promotion_of_a_source_already_promoted_is_refused(service, graph):
    text = export_text(service)
    n, row = line_of(text, "promotion")
    lines = text.splitlines()
    lines[n - 1] = json.dumps({**row, "id": row["id"] + 100})  # a new row, the same source
    with pytest.raises(ImportRejected) as info:
        service.import_memories(io.StringIO("\n".join(lines) + "\n"))
    assert info.value.errors[0][:2] == (n, "source_kind, source_id")
    assert Promotion.objects.count() == 1


@pytest.mark.usefixtures("words")
def test_similar_edges_keep_their_weights_through_a_round_trip(service, user_factory):
    ann = user_factory("ann")
    for key in ("drink", "morning_drink", "usual_drink"):
        service.set_fact(key, "green tea every morning with honey", scope="user", user_id=ann.pk)
    before = edges()
    assert {e[3] for e in before} == {"similar"} and len(before) >= 2
    text = export_text(service)
    service.clear_memories()
    service.import_memories(io.StringIO(text))
    assert edges() == before
