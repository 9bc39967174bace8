"""GET /api/v1/recall/ (staff), GET /healthz, and `manage.py memory reindex`."""

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from memory.models import RecallDocument, RecallEvent
from memory.recall.events import recall_log
from memory.recall.vectors import reset_vector_index

FAKE = {"EMBEDDINGS": "langchain_core.embeddings.DeterministicFakeEmbedding", "EMBEDDINGS_OPTIONS": {"size": 16}}


@pytest.fixture
def fake_embedder(settings):
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), **FAKE}
    reset_vector_index()
    yield
    reset_vector_index()


def test_recall_endpoint_returns_ranked_hits(staff_client, service, user_factory, keyword_only):
    u = user_factory()
    service.set_fact("drink", "espresso doppio", scope="user", user_id=u.pk)
    service.set_fact("snack", "espresso biscuit", scope="agent", agent_id="other")
    response = staff_client.get("/api/v1/recall/", {"q": "espresso", "user": u.pk, "agent_id": "bot"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["mode"] == "keyword" and body["count"] == 1 and body["query"] == "espresso"
    hit = body["results"][0]
    assert (hit["kind"], hit["text"], hit["item"]["key"], hit["item"]["value"]) == (
        "fact",
        "drink: espresso doppio",
        "drink",
        "espresso doppio",
    )
    recall_log.flush()  # the request's end flushed it already; nothing left
    assert RecallEvent.objects.count() == 1


@pytest.mark.parametrize(
    "params, field",
    [
        ({}, "q"),
        ({"q": ""}, "q"),
        ({"q": "x", "limit": 0}, "limit"),
        ({"q": "x", "limit": "ten"}, "limit"),
        ({"q": "x", "user": "abc"}, "user"),
        ({"q": "x", "user_id": 1}, "user_id"),  # one name per parameter: the lists say `user`
        ({"q": "x", "types": "facts,gossip"}, "types"),
        ({"q": "x", "mode": "psychic"}, "mode"),
        ({"q": "x", "min_confidence": 3}, "min_confidence"),
    ],
)
def test_recall_endpoint_names_the_bad_parameter(staff_client, keyword_only, params, field):
    response = staff_client.get("/api/v1/recall/", params)
    assert response.status_code == 400
    assert field in response.json()
    assert RecallEvent.objects.count() == 0


def test_recall_endpoint_is_for_staff_only(client, db, keyword_only):
    assert client.get("/api/v1/recall/", {"q": "x"}).status_code == 401  # anonymous: token auth answers first
    user = get_user_model().objects.create_user("plain", password="pw")
    client.force_login(user)
    assert client.get("/api/v1/recall/", {"q": "x"}).status_code == 403


def test_recall_endpoint_reports_a_changed_model(staff_client, service, fake_embedder, settings):
    service.set_fact("drink", "espresso", scope="global")
    settings.MEMORY = {**settings.MEMORY, "EMBEDDINGS_OPTIONS": {"size": 8}}
    response = staff_client.get("/api/v1/recall/", {"q": "espresso"})
    assert response.status_code == 409
    assert "memory reindex" in response.json()["detail"]


def test_healthz_reports_keyword_only(client, keyword_only):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["recall"] == "keyword-only"


def test_healthz_reports_hybrid(client, fake_embedder):
    assert client.get("/healthz").json()["recall"] == "hybrid"


def test_reindex_command_embeds_every_document(service, fake_embedder, capsys):
    service.set_fact("drink", "espresso", scope="global")
    service.save_procedure("brew", description="steep")
    RecallDocument.objects.update(embedding=None)
    call_command("memory", "reindex", "--batch-size", "1")
    assert "embedded 2 recall documents" in capsys.readouterr().out
    assert not RecallDocument.objects.filter(embedding__isnull=True).exists()
    hits = service.recall("world knowledge drink espresso", mode="vector", limit=1)
    assert [h.item.key for h in hits] == ["drink"]


def test_reindex_command_without_an_embedder_says_so(db, keyword_only):
    with pytest.raises(CommandError, match="keyword-only"):
        call_command("memory", "reindex")


def test_memory_command_needs_a_subcommand(db):
    with pytest.raises(CommandError):
        call_command("memory")
