"""SQLite's FTS5 indexes take changes through deltas (migrations 0007, 0008): searches and recalls see
every change at once, and an index, once caught up, holds exactly the current text and owners."""

import random

import pytest
from django.db import connection

from memory.backends import get_backend
from memory.backends.sqlite import owner_marker
from memory.models import Fact, RecallDocument, Scope

pytestmark = pytest.mark.django_db

FLUSH_AT = 256


@pytest.fixture(autouse=True)
def _sqlite_only():
    if connection.vendor != "sqlite":
        pytest.skip("the FTS5 index and its delta are SQLite's; PostgreSQL's GIN index batches on its own")


def count(table):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        return cursor.fetchone()[0]


def indexed_ids(word, scope_key=None):
    """Fact ids the FTS5 index itself (not the delta) holds under `word` and/or an owner."""
    terms = [f'search_text : "{word}"'] if word else []
    terms += [f'owner : "{owner_marker(scope_key)}"'] if scope_key else []
    query = " AND ".join(terms)
    with connection.cursor() as cursor:
        cursor.execute("SELECT rowid FROM memory_fact_fts WHERE memory_fact_fts MATCH %s ORDER BY rowid", [query])
        return [row[0] for row in cursor.fetchall()]


def found(service, query, **viewer):
    return sorted(f.key for f in service.search_facts(query, **viewer))


def test_searches_see_a_change_before_and_after_the_index_catches_up(service, user_factory):
    user = user_factory()
    service.set_fact("drink", "espresso", scope=Scope.USER, user_id=user.pk)
    assert count("memory_fact_fts_pending") == 1 and indexed_ids("espresso") == []
    assert found(service, "espresso", user_id=user.pk) == ["drink"]

    service.optimize_search_index()
    assert count("memory_fact_fts_pending") == 0
    fact = Fact.objects.get(key="drink")
    assert indexed_ids("espresso") == [fact.pk]
    assert found(service, "espresso", user_id=user.pk) == ["drink"]

    service.set_fact("drink", "matcha", scope=Scope.USER, user_id=user.pk)  # the index still says espresso
    assert indexed_ids("espresso") == [fact.pk]
    assert found(service, "espresso", user_id=user.pk) == []
    assert found(service, "matcha", user_id=user.pk) == ["drink"]

    service.optimize_search_index()
    assert indexed_ids("espresso") == [] and indexed_ids("matcha") == [fact.pk]

    service.delete_fact(fact.pk)
    assert found(service, "matcha", user_id=user.pk) == []
    service.optimize_search_index()
    assert indexed_ids("matcha") == []


def test_a_merge_moves_facts_to_the_survivor_in_search_and_in_the_index(service, user_factory):
    source, target = user_factory(), user_factory()
    service.set_fact("city", "Lisbon", scope=Scope.USER, user_id=source.pk)
    service.optimize_search_index()
    service.merge_users(source.pk, target.pk)
    assert found(service, "lisbon", user_id=target.pk) == ["city"]
    assert found(service, "lisbon", user_id=source.pk) == ["city"]  # a merged id reads as its survivor
    service.optimize_search_index()
    fact = Fact.objects.get(key="city")
    assert indexed_ids("lisbon", f"user:{target.pk}") == [fact.pk]
    assert indexed_ids("lisbon", f"user:{source.pk}") == []


def test_the_delta_moves_into_the_index_every_256_facts(service):
    for i in range(FLUSH_AT - 1):
        service.set_fact(f"k{i}", f"v{i}", agent_id="a", scope=Scope.AGENT)
    assert count("memory_fact_fts_pending") == FLUSH_AT - 1
    service.set_fact("last", "value", agent_id="a", scope=Scope.AGENT)
    assert count("memory_fact_fts_pending") == 0
    assert len(indexed_ids("value", "agent:a")) == 1


def test_after_any_mix_of_writes_the_caught_up_index_holds_exactly_the_current_facts(service, user_factory):
    """Creates, rewrites, owner moves and deletes across several automatic catch-ups: every entry
    the index removes must be the one it holds (FTS5 cannot check that for a contentless table)."""
    rng = random.Random(7)
    users = [user_factory() for _ in range(3)]
    words = ["amber", "birch", "cedar", "delta", "ember", "fjord"]
    owners = [
        {"scope": Scope.AGENT, "agent_id": "a"},
        {"scope": Scope.GLOBAL},
        *({"scope": Scope.USER, "user_id": u.pk} for u in users),
    ]
    for _step in range(900):
        facts = list(Fact.objects.all())
        roll = rng.random()
        if facts and roll < 0.15:
            service.delete_fact(rng.choice(facts).pk)
        elif facts and roll < 0.25:  # an owner move, as an admin edit would make
            fact, agent = rng.choice(facts), rng.choice("ab")
            if not Fact.objects.filter(key=fact.key, agent_id=agent, scope=Scope.AGENT).exists():
                Fact.objects.filter(pk=fact.pk, scope=Scope.AGENT).update(agent_id=agent)
        else:
            key = f"k{rng.randrange(60)}"
            service.set_fact(key, f"{rng.choice(words)} {rng.choice(words)}", **rng.choice(owners))
    service.optimize_search_index()

    facts = list(Fact.objects.all())
    assert count("memory_fact_fts_pending") == 0 and count("memory_fact_fts_stale") == 0
    for word in words:
        expected = sorted(f.pk for f in facts if word in f.search_text)
        assert indexed_ids(word) == expected, word
    for agent in "ab":
        expected = sorted(f.pk for f in facts if f.scope_key == f"agent:{agent}")
        assert indexed_ids(None, f"agent:{agent}") == expected
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO memory_fact_fts(memory_fact_fts) VALUES ('integrity-check')")


def recall_indexed_ids(word):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT rowid FROM memory_recall_fts WHERE memory_recall_fts MATCH %s ORDER BY rowid", [f'text : "{word}"']
        )
        return [row[0] for row in cursor.fetchall()]


def test_keyword_recall_catches_the_recall_index_up_before_reading_it(service):
    service.set_fact("drink", "espresso", scope=Scope.AGENT, agent_id="bot")
    assert count("memory_recall_fts_pending") == 1 and recall_indexed_ids("espresso") == []
    assert [h.item.key for h in service.recall("espresso", agent_id="bot", mode="keyword")] == ["drink"]
    assert count("memory_recall_fts_pending") == 0 and len(recall_indexed_ids("espresso")) == 1

    service.set_fact("drink", "matcha", scope=Scope.AGENT, agent_id="bot")  # the index still says espresso
    assert service.recall("espresso", agent_id="bot", mode="keyword").hits == []
    assert [h.item.key for h in service.recall("matcha", agent_id="bot", mode="keyword")] == ["drink"]


def test_after_any_mix_of_writes_the_caught_up_recall_index_holds_exactly_the_current_documents(service):
    rng = random.Random(11)
    words = ["amber", "birch", "cedar", "delta", "ember", "fjord"]
    for _step in range(700):
        roll = rng.random()
        facts = list(Fact.objects.values_list("pk", flat=True)[:50])
        if facts and roll < 0.15:
            service.delete_fact(rng.choice(facts))
        elif roll < 0.3:
            episode = service.start_episode(agent_id=rng.choice("ab"))
            service.add_message(episode.pk, "user", f"{rng.choice(words)} and {rng.choice(words)}")
        elif roll < 0.35:
            service.save_procedure(f"p{rng.randrange(5)}", description=rng.choice(words))
        else:
            service.set_fact(f"k{rng.randrange(80)}", rng.choice(words), scope=Scope.AGENT, agent_id=rng.choice("ab"))
    get_backend().catch_up_recall_index()

    assert count("memory_recall_fts_pending") == 0 and count("memory_recall_fts_stale") == 0
    docs = list(RecallDocument.objects.values_list("pk", "text"))
    for word in words:
        assert recall_indexed_ids(word) == sorted(pk for pk, text in docs if word in text.split()), word
