"""Memory health (five metrics, score, colour band) and GET /healthz."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from memory.embedding.embedder import configured_mode
from memory.models import Episode, Fact
from memory.operations import health
from memory.recall.indexer import pending_count

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_health_cache():
    health.clear_cache()
    yield
    health.clear_cache()


def test_an_empty_memory_has_no_band_to_report(service):
    report = service.memory_health()
    assert report.band == "unknown" and report.score is None
    assert report.metrics == dict.fromkeys(health.WEIGHTS)


def test_the_five_metrics_and_their_weighted_band(service):
    done = [service.start_episode(agent_id="bot") for _ in range(2)]
    for episode in done:
        service.complete_episode(episode.pk, success=True)
    service.start_episode(agent_id="bot")  # still running: not counted by coverage
    Episode.objects.filter(pk=done[0].pk).update(processed_for_facts=True)
    traced = service.set_fact("city", "Porto", source_episode_id=done[0].pk, provenance="consolidation").fact
    disputed = service.set_fact("tea", "green").fact
    service.set_fact("tea", "black")  # one contradiction
    long_ago = timezone.now() - timedelta(days=3)
    Fact.objects.filter(pk__in=[traced.pk, disputed.pk]).update(created_at=long_ago)
    service.get_fact("city")  # recalled once
    report = service.memory_health()
    assert report.metrics["coverage"] == pytest.approx(50.0)  # 1 of 2 finished episodes
    assert report.metrics["coherence"] == pytest.approx(75.0)  # (1 + 1/2) / 2
    assert report.metrics["efficiency"] == pytest.approx(50.0)  # 1 of 2 old facts recalled
    assert report.metrics["reachability"] == pytest.approx(50.0)  # 1 of 2 facts traced to a source
    assert report.metrics["freshness"] == pytest.approx(100.0, abs=0.1)  # written just now
    assert report.score == pytest.approx((100 * 25 + 50 * 25 + 75 * 20 + 50 * 15 + 50 * 15) / 100, abs=0.1)
    assert report.band == "yellow"


def test_stale_unconsolidated_memory_is_red(service):
    episode = service.start_episode(agent_id="bot")
    service.complete_episode(episode.pk, success=True)
    fact = service.set_fact("old", "news").fact
    Fact.objects.filter(pk=fact.pk).update(
        updated_at=timezone.now() - timedelta(days=365), created_at=timezone.now() - timedelta(days=365)
    )
    report = service.memory_health()
    assert report.metrics["freshness"] < 1 and report.metrics["coverage"] == 0
    assert report.band == "red"


@pytest.mark.parametrize(
    "score, band",
    [(None, "unknown"), (0, "red"), (49.9, "red"), (50, "yellow"), (74.9, "yellow"), (75, "green"), (100, "green")],
)
def test_bands(score, band):
    assert health.band_of(score) == band


def test_health_of_one_agent(service):
    for agent in ("a", "b"):
        episode = service.start_episode(agent_id=agent)
        service.complete_episode(episode.pk, success=True)
    Episode.objects.filter(agent_id="a").update(processed_for_facts=True)
    assert service.memory_health(agent_id="a").metrics["coverage"] == 100
    assert service.memory_health(agent_id="b").metrics["coverage"] == 0
    assert service.memory_health().metrics["coverage"] == 50


# ------------------------------------------------------------------ /healthz


def test_healthz_needs_no_login_and_shows_no_memory(client, service, keyword_only):
    service.set_fact("secret_code", "4242", provenance="consolidation")
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response["Cache-Control"].startswith("max-age=0")
    body = response.json()
    assert body == {
        "status": "ok",
        "database": "ok",
        "checkpointer": "ok",  # the workflows app registers its saver's check
        "recall": "keyword-only",
        "unhandled_errors": body["unhandled_errors"],
        "vectors": {"pending": 0, "failures": body["vectors"]["failures"], "cache": body["vectors"]["cache"]},
        "last_consolidation": None,
        "health": {"band": body["health"]["band"], "score": body["health"]["score"]},
    }
    assert body["health"]["band"] in ("green", "yellow", "red") and 0 <= body["health"]["score"] <= 100
    assert "secret_code" not in response.content.decode() and "4242" not in response.content.decode()


def test_healthz_reports_the_last_consolidation(client, service):
    episode = service.start_episode(agent_id="bot")
    service.add_message(episode.pk, "user", "My city is Porto.")
    service.complete_episode(episode.pk, success=True)
    run = service.consolidate()
    body = client.get("/healthz").json()
    assert body["last_consolidation"] == {
        "finished_at": run.finished_at.isoformat(),
        "ok": True,
        "episodes_processed": 1,
        "episodes_failed": 0,
    }


def test_healthz_shows_registered_components(client, service):
    health.register_component("checkpointer", lambda: "ok")
    try:
        assert client.get("/healthz").json()["checkpointer"] == "ok"
        health.register_component("checkpointer", lambda: "unreachable")
        body = client.get("/healthz").json()
        assert (body["status"], body["checkpointer"]) == ("degraded", "unreachable")
    finally:
        from workflows.conversations.upkeep import checkpointer_status

        health.register_component("checkpointer", checkpointer_status)


def test_healthz_polls_are_cheap(client, service, django_assert_max_num_queries):
    client.get("/healthz")
    # SELECT 1 and the last consolidation (health is reused); with hybrid recall, the two counts of
    # texts waiting for a vector.
    with django_assert_max_num_queries(4 if configured_mode() == "hybrid" else 2):
        assert client.get("/healthz").status_code == 200


def test_the_vector_backlog_is_counted_from_its_own_small_index(service):
    """/healthz counts pending vectors on every poll: from a partial index of just those rows, never
    a scan of every stored vector (a million of them at scale)."""
    with CaptureQueriesContext(connection) as queries:
        pending_count()
    assert len(queries.captured_queries) == 2
    explain = "EXPLAIN QUERY PLAN " if connection.vendor == "sqlite" else "EXPLAIN "
    with connection.cursor() as cursor:
        for query, index in zip(queries.captured_queries, ("recall_doc_pending", "store_item_pending")):
            cursor.execute(explain + query["sql"])
            assert index in " ".join(str(row) for row in cursor.fetchall())


def test_healthz_only_answers_get(client):
    assert client.post("/healthz").status_code == 405


@pytest.mark.django_db(transaction=True)
def test_healthz_is_503_when_the_database_is_unreachable(client, tmp_path):
    settings_dict = connection.settings_dict
    saved = dict(settings_dict)
    connection.close()
    if connection.vendor == "sqlite":
        settings_dict["NAME"] = str(tmp_path / "no such folder" / "db.sqlite3")
    else:
        settings_dict.update(HOST="127.0.0.1", PORT="9")  # nothing listens on the discard port
    try:
        response = client.get("/healthz")
    finally:
        connection.close()
        settings_dict.clear()
        settings_dict.update(saved)
    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["database"], body["health"]) == ("unavailable", "unreachable", None)
