"""Concept tags: derived from a fact's key and value and an episode's summary and messages, kept with every
write, filterable in the REST API (?concept=) and the admin (memory/text.py, concept_tags)."""

from datetime import timedelta

from django.utils import timezone

from memory.models import Episode, Fact
from memory.text import concept_tags


def test_concept_tags_are_the_most_used_content_words_in_order():
    text = "The invoice for March: pay the invoice to Acme by Friday. Acme sends 2 invoices."
    assert concept_tags(text) == ["invoice", "acme", "march", "pay", "friday"]
    assert concept_tags("a an the of 42 2026 ok") == []  # stop words, short words and numbers are no concepts
    assert concept_tags(text, limit=2) == concept_tags(text)[:2]


def test_a_fact_carries_concepts_of_its_key_and_value_through_every_write(service):
    fact = service.set_fact("favourite_cuisine", "spicy thai cuisine", scope="global").fact
    assert Fact.objects.get(pk=fact.pk).concepts == "cuisine favourite spicy thai"
    service.set_fact("favourite_cuisine", "japanese ramen", scope="global")
    assert Fact.objects.get(pk=fact.pk).concepts == "favourite cuisine japanese ramen"
    service.edit_fact(fact.pk, value={"dish": "sushi"}, confidence=0.9, fact_type="user_preference")
    assert Fact.objects.get(pk=fact.pk).concepts == "favourite cuisine dish sushi"


def test_an_episode_carries_concepts_of_its_summary_and_messages(service):
    recorded = service.record_episode(
        started_at=timezone.now() - timedelta(seconds=1),
        agent_id="helper",
        conversation=[
            {"role": "user", "content": "Book a flight to Lisbon"},
            {"role": "assistant", "content": "Flight booked."},
        ],
        success=True,
    )
    assert Episode.objects.get(pk=recorded.pk).concepts == "flight book lisbon booked"
    started = service.start_episode(agent_id="helper")
    service.add_message(started.pk, "user", "invoice overdue")
    service.complete_episode(started.pk, success=True, summary="Chased the overdue invoice")
    assert Episode.objects.get(pk=started.pk).concepts == "overdue invoice chased"


def seed(service):
    service.set_fact("billing_contact", "invoices go to accounts", scope="global")
    service.set_fact("office_city", "Lisbon", scope="global")
    service.record_episode(
        started_at=timezone.now() - timedelta(seconds=1),
        conversation=[{"role": "user", "content": "the invoice is overdue"}],
        success=True,
    )
    service.record_episode(
        started_at=timezone.now() - timedelta(seconds=1),
        conversation=[{"role": "user", "content": "weather in lisbon"}],
        success=True,
    )


def test_the_rest_api_filters_facts_and_episodes_by_concept(service, api):
    seed(service)
    facts = api.get("/api/v1/facts/", {"concept": "Lisbon"}).json()["results"]
    assert [(f["key"], f["concepts"]) for f in facts] == [("office_city", ["office", "city", "lisbon"])]
    episodes = api.get("/api/v1/episodes/", {"concept": "invoice"}).json()["results"]
    assert [e["concepts"] for e in episodes] == [["invoice", "overdue"]]
    assert api.get("/api/v1/facts/", {"concept": "lis"}).json()["results"] == []  # a whole tag, not a part
    assert len(api.get("/api/v1/facts/").json()["results"]) == 2


def test_the_admin_offers_and_applies_a_concept_filter(service, staff_client):
    seed(service)
    html = staff_client.get("/memories/memory/fact/").content.decode()
    assert "?concept=lisbon" in html and "?concept=billing" in html
    html = staff_client.get("/memories/memory/fact/", {"concept": "lisbon"}).content.decode()
    assert "office_city" in html and "billing_contact" not in html
    html = staff_client.get("/memories/memory/episode/", {"concept": "overdue"}).content.decode()
    assert "invoice is overdue" in html and "weather in lisbon" not in html
