"""GET /metrics: memory counts, vector backlog, reminders due, errors and recall latency in Prometheus's
text format, read back with the official client's parser."""

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from workflows.models import Reminder


def scrape(client, **headers):
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


@pytest.mark.django_db
def test_metrics_count_memory_reminders_and_recall_latency_without_a_login(client, service, user_factory):
    ada = user_factory("ada")
    service.set_fact("drink", "oolong", scope="user", user_id=ada.pk)
    service.set_fact("office", "Berlin", scope="global")
    service.record_episode(started_at=timezone.now(), agent_id="bot", user_id=ada.pk, summary="hi", success=True)
    now = timezone.now()
    Reminder.objects.create(user=ada, message="due", due_at=now, next_attempt_at=now - timedelta(minutes=1))
    Reminder.objects.create(user=ada, message="later", due_at=now, next_attempt_at=now + timedelta(days=1))
    before = scrape(client)
    service.recall("oolong", user_id=ada.pk)
    samples = scrape(client)

    assert samples[("engram_memory_rows", (("kind", "facts"),))] == 2
    assert samples[("engram_memory_rows", (("kind", "episodes"),))] == 1
    assert samples[("engram_memory_rows", (("kind", "users"),))] == 1
    assert samples[("engram_facts", (("scope", "user"),))] == 1
    assert samples[("engram_facts", (("scope", "global"),))] == 1
    assert samples[("engram_reminders_due", ())] == 1
    assert samples[("engram_vector_backlog", ())] == service.pending_vectors()
    assert ("engram_errors_total", (("kind", "unhandled_request"),)) in samples
    # The histogram counts each recall of this process.
    count = ("engram_recall_duration_seconds_count", ())
    assert samples[count] == before[count] + 1
    assert samples[("engram_recall_duration_seconds_bucket", (("le", "+Inf"),))] == samples[count]
    assert "oolong" not in str(samples) and "Berlin" not in str(samples)  # no memory content


@pytest.mark.django_db
def test_a_metrics_token_is_required_when_set(client, settings):
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), "METRICS_TOKEN": "s3cret"}
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert ("engram_vector_backlog", ()) in scrape(client, HTTP_AUTHORIZATION="Bearer s3cret")


@pytest.mark.django_db
def test_metrics_refuse_other_methods(client):
    assert client.post("/metrics").status_code == 405
