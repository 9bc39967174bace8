"""Fact search picks its plan per query from the database's statistics (a selective word through the
index, or each owner's facts walked best-first when every word is broad); whichever plan runs, the
answer is the one the definition gives: every word in the text, shadowed facts left out, most
confident first, then the more specific, then the newer."""

import random

import pytest
from django.db import connection

from memory.backends import get_backend, reset_backend
from memory.backends.base import WALK_OWNERS
from memory.models import SCOPE_RANK, Fact, Scope
from memory.rules.validation import make_viewer

pytestmark = pytest.mark.django_db

BROAD = 3000  # facts that all say "note" (about 2,650 once each owner holds a key once): more than
# the 2,000 rows a selective word may have


@pytest.fixture
def store(user_factory):
    """A store with one broad word ("note"), rarer words, shadowed keys, and statistics gathered."""
    rng = random.Random(4)
    ann, bob = user_factory(), user_factory()
    owners = [
        {"scope": Scope.GLOBAL},
        {"scope": Scope.AGENT, "agent_id": "helper"},
        {"scope": Scope.AGENT, "agent_id": "other-agent"},
        {"scope": Scope.USER, "user": ann},
        {"scope": Scope.USER, "user": bob},
        {"scope": Scope.SESSION, "session_id": "s1"},
    ]
    facts = []
    for i in range(BROAD):
        owner = owners[i % len(owners)]
        # Keys repeat across owners, so the more specific owner's fact shadows the others.
        key = f"topic_{rng.randrange(2000)}"
        facts.append(
            Fact(
                key=key,
                value=f"note {rng.randrange(10**5)} {rng.choice(['tea', 'coffee', 'quince jam', 'rare-word'])}",
                confidence=round(rng.uniform(0.3, 1.0), 2),
                **owner,
            )
        )
    by_owner_key = {}
    for fact in facts:  # one fact per owner and key, as the unique constraint wants
        by_owner_key.setdefault((fact.scope, fact.agent_id, fact.user_id, fact.session_id, fact.key), fact)
    for fact in by_owner_key.values():
        fact.save()
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {Fact._meta.db_table}")
    reset_backend()  # a backend built now reads the fresh statistics
    yield ann, bob
    reset_backend()


def expected(query, *, agent_id="", user=None, session_id="", limit=10):
    """The definition, in Python: visible, not shadowed, holding every word; best first."""
    visible = [
        f
        for f in Fact.objects.all()
        if f.scope == Scope.GLOBAL
        or (f.scope == Scope.AGENT and agent_id and f.agent_id == agent_id)
        or (f.scope == Scope.USER and user is not None and f.user_id == user.pk)
        or (f.scope == Scope.SESSION and session_id and f.session_id == session_id)
    ]
    best = {}
    for f in visible:
        held = best.get(f.key)
        if held is None or SCOPE_RANK[f.scope] < SCOPE_RANK[held.scope]:
            best[f.key] = f
    words = query.lower().replace("-", " ").replace("_", " ").split()
    found = [f for f in best.values() if all(w in f.search_text for w in words)]
    found.sort(key=lambda f: (-f.confidence, SCOPE_RANK[f.scope], -f.updated_at.timestamp(), f.pk))
    return [f.pk for f in found[:limit]]


QUERIES = ["note", "note tea", "note 12", "quince jam", "rare word note", "note 7", "coffee 9", "tea", "no such thing"]


@pytest.mark.parametrize("query", QUERIES)
def test_every_plan_answers_what_the_definition_says(service, store, query):
    ann, bob = store
    for viewer in (
        {"agent_id": "helper", "user": ann, "session_id": "s1"},
        {"agent_id": "helper", "user": bob},
        {"user": ann},
        {},
    ):
        user = viewer.get("user")
        got = service.search_facts(
            query,
            agent_id=viewer.get("agent_id", ""),
            user_id=None if user is None else user.pk,
            session_id=viewer.get("session_id", ""),
            limit=10,
        )
        assert [f.pk for f in got] == expected(query, **viewer), (query, viewer)


def test_the_plan_follows_the_words_statistics(service, store):
    """The queries above do reach each plan: a broad word alone is walked owner by owner, a rarer
    word goes through the index (so the comparison with the definition covers both)."""
    backend = get_backend()
    viewer = make_viewer("helper", store[0].pk, "s1")
    assert backend.fact_candidates(["note"], viewer, True) is WALK_OWNERS
    assert backend.fact_candidates(["note", "12"], viewer, True) is WALK_OWNERS  # "12": too short to index
    source, condition, params = backend.fact_candidates(["note", "quince"], viewer, True)
    assert "quince" in " ".join(map(str, params)) and "note" not in " ".join(map(str, params))
