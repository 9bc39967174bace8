"""Two workspaces that pick the same agent id, session id and global keys: as workspace A, the
point-in-time reads (as_of, valid_at), recall's candidates and the health counts hold A's rows only,
and B's rows, more specific or more numerous, neither take A's places nor hide A's memories.

Owner keys of agents, sessions and everyone are the same text in every workspace
(docs/guides/workspaces.md), so these are the reads where B's rows share A's owners.
"""

import json

import numpy as np
import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.authtoken.models import Token

from memory.embedding.embedder import to_blob
from memory.models import (
    FactAction,
    FactVersion,
    MemoryRelation,
    RecallDocument,
    RecallScope,
    Workspace,
    WorkspaceMember,
    in_workspace,
)
from memory.operations import health
from memory.recall import vectors
from memory.recall.relations import link_similar
from memory.recall.vectors import OwnerMatrix, VectorIndex

AGENT, SESSION = "support-bot", "s-1"
AGENT_OWNER = f"agent:{AGENT}"


@pytest.fixture
def spaces(db):
    return Workspace.objects.create(slug="a", name="A"), Workspace.objects.create(slug="b", name="B")


def values(facts):
    return sorted(json.dumps(f.value) for f in facts)


# ------------------------------------------------------------------ point-in-time reads


def test_a_past_read_never_shows_another_workspaces_version_of_a_shared_owner(service, spaces, keyword_only):
    a, b = spaces
    with in_workspace(b):
        tone_b = service.set_fact("tone", "B formal", scope="agent", agent_id=AGENT).fact
        service.set_fact("motto", "B everyone", scope="global")
    while_b_held = timezone.now()
    with in_workspace(b):
        service.delete_fact(tone_b.pk)
    with in_workspace(a):
        service.set_fact("tone", "A friendly", scope="agent", agent_id=AGENT)
    now = timezone.now()
    viewer = {"agent_id": AGENT, "session_id": SESSION}
    with in_workspace(a):
        assert service.get_fact("tone", **viewer, as_of=while_b_held) is None
        assert service.get_fact("motto", as_of=now) is None
        assert service.get_fact("tone", **viewer, as_of=now).value == "A friendly"
        assert service.search_facts("formal everyone", **viewer, as_of=while_b_held) == []
        assert values(service.search_facts("tone", **viewer, valid_at=now)) == ['"A friendly"']
        # Recall finds A's fact by what it says now; as of then, A's held nothing (B's did).
        assert [h.text for h in service.recall("tone friendly", **viewer, as_of=while_b_held).hits] == []
        assert "A friendly" in service.recall("tone friendly", **viewer, as_of=now).hits[0].text
        assert [v.value for v in service.fact_history(key="tone", scope="agent", agent_id=AGENT)] == ["A friendly"]
    with in_workspace(b):  # B still reads its own past
        assert service.get_fact("tone", **viewer, as_of=while_b_held).value == "B formal"
        assert service.get_fact("motto", as_of=now).value == "B everyone"


def test_a_more_specific_state_of_another_workspace_does_not_hide_ones_own(service, spaces, keyword_only):
    a, b = spaces
    with in_workspace(a):
        service.set_fact("mood", "A calm", scope="agent", agent_id=AGENT)
    with in_workspace(b):
        service.set_fact("mood", "B grumpy", scope="session", session_id=SESSION)
    now = timezone.now()
    with in_workspace(a):
        for times in ({"valid_at": now}, {"as_of": now}):
            assert service.get_fact("mood", agent_id=AGENT, session_id=SESSION, **times).value == "A calm", times
            found = service.search_facts("mood", agent_id=AGENT, session_id=SESSION, **times)
            assert values(found) == ['"A calm"'], times
        # Recall now as well (the current lookups and searches keep to the workspace in their own SQL).
        for times in ({}, {"valid_at": now}, {"as_of": now}):
            hits = service.recall("mood calm grumpy", agent_id=AGENT, session_id=SESSION, **times).hits
            assert [h.item.value for h in hits] == ["A calm"], times


def _version_of_b(b, value, action, when):
    """A version of B's under A's owner and key, as B writes it once keys are unique per workspace
    (today's unique (owner, key) index keeps B from holding that fact while A does)."""
    return FactVersion.objects.create(
        workspace=b, fact_id=10**9, action=action, key="plan", value=value, scope="agent",
        scope_key=AGENT_OWNER, agent_id=AGENT, confidence=0.9, valid_from=when,
    )  # fmt: skip


def test_another_workspaces_later_versions_neither_take_the_place_of_ones_own_nor_end_it(service, spaces):
    a, b = spaces
    with in_workspace(a):
        service.set_fact("plan", "A gold", scope="agent", agent_id=AGENT)
    _version_of_b(b, "B basic", FactAction.CREATED, timezone.now())
    later = timezone.now()
    with in_workspace(a):
        assert service.get_fact("plan", agent_id=AGENT, as_of=later).value == "A gold"
    _version_of_b(b, "B basic", FactAction.DELETED, timezone.now())
    with in_workspace(a):
        assert service.get_fact("plan", agent_id=AGENT, as_of=timezone.now()).value == "A gold"
        assert service.get_fact("plan", agent_id=AGENT, valid_at=timezone.now()).value == "A gold"
    with in_workspace(b):
        assert service.get_fact("plan", agent_id=AGENT, as_of=later).value == "B basic"


def test_versions_carry_their_facts_workspace_the_deleted_one_included(service, spaces):
    a, b = spaces
    with in_workspace(b):
        fact = service.set_fact("city", "Porto", scope="agent", agent_id=AGENT).fact
        service.set_fact("city", "Lisbon", scope="agent", agent_id=AGENT)
        service.delete_fact(fact.pk)
    stored = FactVersion.objects.filter(fact_id=fact.pk)
    assert sorted(stored.values_list("action", "workspace_id")) == [
        ("created", b.pk),
        ("deleted", b.pk),
        ("updated", b.pk),
    ]
    with in_workspace(a):
        assert not FactVersion.objects.filter(fact_id=fact.pk).exists()


# ------------------------------------------------------------------ recall's candidates


def test_another_workspaces_documents_take_no_candidate_place(service, spaces, keyword_only, settings):
    a, b = spaces
    settings.MEMORY = {**settings.MEMORY, "RECALL_CANDIDATES": 3}
    with in_workspace(b):
        for n in range(6):  # better keyword matches than A's, under the same owner
            service.set_fact(f"parcel {n}", "parcel parcel parcel", scope="agent", agent_id=AGENT)
            service.record_episode(
                started_at=timezone.now(), agent_id=AGENT, summary="parcel parcel parcel", success=True
            )
    with in_workspace(a):
        own = service.set_fact("parcel note", "A parcel", scope="agent", agent_id=AGENT).fact
        hits = service.recall("parcel", agent_id=AGENT, limit=1).hits
        assert [(h.kind, h.id) for h in hits] == [("fact", own.pk)]
    assert set(RecallDocument.objects.values_list("workspace_id", flat=True)) == {a.pk, b.pk}


def test_a_procedure_of_another_workspace_does_not_shadow_a_shared_one(service, spaces, keyword_only):
    a, b = spaces
    with in_workspace(a):
        shared = service.save_procedure("refund", agent_id="", description="A refund steps")
    with in_workspace(b):
        service.save_procedure("refund", agent_id=AGENT, description="B refund steps")
    with in_workspace(a):
        hits = service.recall("refund steps", agent_id=AGENT, types=["procedures"]).hits
        assert [(h.kind, h.id) for h in hits] == [("procedure", shared.pk)]


def _unit(rows, dimension=8, seed=7):
    matrix = np.random.default_rng(seed).standard_normal((rows, dimension)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


@pytest.mark.parametrize("exact_rows", [20_000, 10])  # an exact scan, then the sign-bit shortlist
def test_an_owners_vectors_answer_for_one_workspace(monkeypatch, exact_rows):
    monkeypatch.setattr(vectors, "EXACT_ROWS", exact_rows)
    monkeypatch.setattr(vectors, "SHORTLIST_MIN", 4)
    vecs = _unit(60)
    matrix = OwnerMatrix(8)
    # Documents 1-59 are workspace 2's, document 60 (the farthest from the query) workspace 1's.
    query = vecs[0]
    order = np.argsort(-(vecs @ query))
    ids = [int(i) + 1 for i in order]
    matrix.apply(ids, [to_blob(vecs[i]) for i in order], [2] * 59 + [1])
    assert matrix.top(query, 5, 1)[0].tolist() == [ids[-1]]
    two = matrix.top(query, 5, 2)[0].tolist()
    assert len(two) == 5 and ids[-1] not in two
    assert len(matrix.top(query, 60)[0]) == 60  # no workspace: every document


def test_the_vector_index_loads_each_documents_workspace(service, spaces):
    a, b = spaces
    found = {}
    with in_workspace(a):
        found[a.pk] = service.set_fact("note a", "A", scope="agent", agent_id=AGENT).fact.pk
    with in_workspace(b):
        found[b.pk] = service.set_fact("note b", "B", scope="agent", agent_id=AGENT).fact.pk
    vecs = _unit(2, dimension=4)
    for vec, fact_id in zip(vecs, found.values()):
        RecallDocument.objects.filter(kind="fact", item_id=fact_id).update(embedding=to_blob(vec))
    doc = dict(RecallDocument.objects.filter(kind="fact").values_list("item_id", "id"))
    index = VectorIndex(4)
    scope = RecallScope.objects.get(owner=AGENT_OWNER)
    index.sync({AGENT_OWNER: (scope.generation, scope.removed)})
    for workspace, fact_id in found.items():
        # The other workspace's document is the nearer one for each query: still never a candidate.
        query = vecs[1] if workspace == a.pk else vecs[0]
        assert [d for d, _ in index.search([AGENT_OWNER], query, 5, workspace)] == [doc[fact_id]]
    assert len(index.search([AGENT_OWNER], vecs[0], 5)) == 2


def test_similar_edges_join_documents_of_one_workspace(service, spaces):
    a, b = spaces
    with in_workspace(a):
        first_a = service.set_fact("note a1", "A", scope="agent", agent_id=AGENT).fact.pk
        second_a = service.set_fact("note a2", "A", scope="agent", agent_id=AGENT).fact.pk
    with in_workspace(b):
        of_b = service.set_fact("note b", "B", scope="agent", agent_id=AGENT).fact.pk
    base = _unit(1, dimension=4)[0]
    near = {first_a: base, second_a: base + 0.05, of_b: base + 0.01}  # B's is the nearest to A's first
    for fact_id, vec in near.items():
        vec = vec / np.linalg.norm(vec)
        RecallDocument.objects.filter(kind="fact", item_id=fact_id).update(embedding=to_blob(vec))
    doc = dict(RecallDocument.objects.filter(kind="fact").values_list("item_id", "id"))
    source = doc[first_a]
    assert link_similar([(source, np.asarray([near[first_a]], dtype=np.float32))]) == 1
    assert list(MemoryRelation.objects.filter(source_id=source).values_list("target_id", flat=True)) == [doc[second_a]]


# ------------------------------------------------------------------ /healthz and /metrics


@pytest.fixture
def member_of_a(spaces, django_user_model):
    user = django_user_model.objects.create_user("operator-a", is_staff=True)
    WorkspaceMember.objects.create(user=user, workspace=spaces[0])
    return user


def _samples(response):
    assert response.status_code == 200, response.content
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


FACTS = ("engram_memory_rows", (("kind", "facts"),))


@pytest.fixture
def filled(service, spaces, keyword_only):
    a, b = spaces
    health.clear_cache()
    with in_workspace(b):
        for n in range(3):
            service.set_fact(f"rule {n}", "B", scope="agent", agent_id=AGENT)
    yield
    health.clear_cache()


def test_metrics_inside_a_workspace_count_its_rows_only(client, filled, member_of_a, service, spaces, settings):
    token = Token.objects.create(user=member_of_a).key
    with in_workspace(spaces[0]):
        service.set_fact("rule", "A", scope="agent", agent_id=AGENT)
    assert _samples(client.get("/metrics"))[FACTS] == 4  # anonymous: the deployment
    assert _samples(client.get("/metrics", HTTP_AUTHORIZATION=f"Token {token}"))[FACTS] == 1
    client.force_login(member_of_a)
    assert _samples(client.get("/metrics"))[FACTS] == 1
    client.logout()
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token not-a-token").status_code == 401  # not the deployment's
    settings.MEMORY = {**settings.MEMORY, "METRICS_TOKEN": "s3cret"}
    assert client.get("/metrics").status_code == 401
    assert _samples(client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret"))[FACTS] == 4
    assert _samples(client.get("/metrics", HTTP_AUTHORIZATION=f"Token {token}"))[FACTS] == 1
    assert client.get("/metrics", HTTP_AUTHORIZATION="Token not-a-token").status_code == 401


def test_healthz_inside_a_workspace_bands_its_rows_only(client, filled, member_of_a):
    token = Token.objects.create(user=member_of_a).key
    anonymous = client.get("/healthz").json()["health"]
    assert anonymous["band"] in ("green", "yellow", "red")  # B's facts are measured
    inside = client.get("/healthz", HTTP_AUTHORIZATION=f"Token {token}").json()
    assert inside["health"] == {"band": "unknown", "score": None}  # A has no memory yet
    assert inside["database"] == "ok"
    client.force_login(member_of_a)
    assert client.get("/healthz").json()["health"] == {"band": "unknown", "score": None}
    client.logout()
    assert client.get("/healthz").json()["health"] == anonymous  # each workspace's report is cached apart
    refused = client.get("/healthz", HTTP_AUTHORIZATION="Token not-a-token")
    assert refused.status_code == 401 and "memory" not in refused.content.decode()
