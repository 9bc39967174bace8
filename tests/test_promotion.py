"""Promotion: memories recall keeps returning become durable facts, each once (memory/learning/promotion.py)."""

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from memory.exceptions import InvalidMemoryArgument
from memory.learning.consolidation import BaseExtractor, ExtractedFact
from memory.models import Fact, Promotion, RecallEvent, Scope


def ask(service, query, user, session, times):
    for _ in range(times):
        hits = service.recall(query, agent_id="helper", user_id=user.pk, session_id=session)
        assert hits, f"recall found nothing for {query!r}"


@pytest.fixture
def session_fact(service, user_factory):
    ann = user_factory("ann")
    service.set_fact("favourite_drink", "green tea", scope=Scope.SESSION, session_id="s1", fact_type="user_preference")
    return ann


def test_a_session_fact_recalled_often_becomes_the_users_fact_once(service, session_fact):
    ask(service, "favourite drink", session_fact, "s1", times=3)
    report = service.promote()
    assert report.ok and [p["source"] for p in report.promoted] == [f"fact:{Fact.objects.get(scope=Scope.SESSION).pk}"]
    promoted = Fact.objects.get(scope=Scope.USER, user=session_fact)
    assert (promoted.key, promoted.value, promoted.fact_type, promoted.provenance) == (
        "favourite_drink",
        "green tea",
        "user_preference",
        "promotion",
    )
    assert Fact.objects.filter(scope=Scope.SESSION).exists()  # the session's own fact stays
    ledger = Promotion.objects.get()
    assert (ledger.rule, ledger.user_id, ledger.recalls, ledger.fact_ids) == (
        "session_fact",
        session_fact.pk,
        3,
        [promoted.pk],
    )
    # Recalled again, it is not promoted again: the user's fact is not confirmed a second time.
    ask(service, "favourite drink", session_fact, "s1", times=3)
    assert service.promote().promoted == []
    assert Fact.objects.get(pk=promoted.pk).times_confirmed == promoted.times_confirmed
    assert Promotion.objects.count() == 1


def test_a_memory_recalled_less_often_is_not_promoted(service, session_fact):
    ask(service, "favourite drink", session_fact, "s1", times=2)
    assert service.promote().promoted == []
    assert not Fact.objects.filter(scope=Scope.USER).exists() and not Promotion.objects.exists()
    assert [p["source"] for p in service.promote(min_recalls=2, dry_run=True).promoted]  # a lower bar would
    assert not Promotion.objects.exists()  # and a dry run writes nothing


class DrinkExtractor(BaseExtractor):
    """An extractor as a deployment would write one (a chat model's stand-in): it must not run in a transaction."""

    calls = []

    def extract(self, episode):
        DrinkExtractor.calls.append(connection.in_atomic_block)
        return [ExtractedFact(key="usual_order", value="a flat white", fact_type="user_preference")]


@pytest.mark.django_db(transaction=True)  # so that "inside a transaction" means the code's own
def test_an_episode_recalled_across_sessions_is_distilled_into_facts_outside_any_transaction(service, user_factory):
    ann = user_factory("ann")
    service.record_episode(
        started_at=timezone.now(),
        success=True,
        agent_id="helper",
        user_id=ann.pk,
        session_id="s1",
        conversation=[{"role": "user", "content": "my usual order at the cafe is a flat white"}],
        summary="usual order at the cafe: a flat white",
    )
    ask(service, "usual order cafe", ann, "s2", times=2)
    DrinkExtractor.calls.clear()
    assert service.promote(extractor=DrinkExtractor()).promoted == []  # one session is not a pattern
    ask(service, "usual order cafe", ann, "s3", times=1)
    report = service.promote(extractor=DrinkExtractor())
    assert report.ok and len(report.promoted) == 1 and report.promoted[0]["sessions"] == 2
    fact = Fact.objects.get(key="usual_order")
    assert (fact.scope, fact.user_id, fact.value, fact.provenance) == ("user", ann.pk, "a flat white", "promotion")
    assert fact.source_episode_id == Promotion.objects.get().source_id
    assert DrinkExtractor.calls == [False]
    assert service.promote(extractor=DrinkExtractor()).promoted == [] and DrinkExtractor.calls == [False]


def test_a_failing_extractor_is_reported_and_nothing_is_promoted(service, user_factory):
    class Broken(BaseExtractor):
        def extract(self, episode):
            raise RuntimeError("model unavailable")

    ann = user_factory("ann")
    service.record_episode(
        started_at=timezone.now(), success=True, user_id=ann.pk, session_id="s1", summary="walked the dog at dawn"
    )
    for session in ("s2", "s3", "s4"):
        ask(service, "walked the dog", ann, session, times=1)
    report = service.promote(extractor=Broken())
    assert not report.ok and "model unavailable" in next(iter(report.failed.values()))
    assert not Promotion.objects.exists()
    assert service.promote(extractor=DrinkExtractor()).ok  # tried again on the next sweep
    assert Promotion.objects.count() == 1


def test_consolidation_runs_a_promotion_sweep_after_it(service, session_fact, settings):
    ask(service, "favourite drink", session_fact, "s1", times=3)
    report = service.consolidate()
    assert report.promotion is not None and len(report.promotion.promoted) == 1
    assert report.as_dict()["promotion"]["promoted"][0]["rule"] == "session_fact"
    settings.MEMORY = {**settings.MEMORY, "PROMOTION": {"AFTER_CONSOLIDATION": False}}
    assert service.consolidate().promotion is None


def test_forgetting_a_person_deletes_their_promotions(service, session_fact):
    ask(service, "favourite drink", session_fact, "s1", times=3)
    service.promote()
    assert Promotion.objects.filter(user=session_fact).exists()
    service.delete_users([session_fact.pk], cascade=True)
    assert not Promotion.objects.exists()


def test_recall_events_past_their_retention_are_deleted_by_promote_and_prune(service, session_fact, settings):
    ask(service, "favourite drink", session_fact, "s1", times=2)
    service.flush_recall_log()
    RecallEvent.objects.update(created_at=timezone.now() - timedelta(days=91))
    ask(service, "favourite drink", session_fact, "s1", times=1)
    service.flush_recall_log()
    assert service.prune(dry_run=True).deleted["recall_events"] == 2 and RecallEvent.objects.count() == 3
    assert service.promote().events_deleted == 2
    assert RecallEvent.objects.count() == 1 and not Promotion.objects.exists()  # old hits count no more
    RecallEvent.objects.update(created_at=timezone.now() - timedelta(days=91))
    assert service.prune().deleted["recall_events"] == 1
    settings.MEMORY = {**settings.MEMORY, "PROMOTION": {"RECALL_EVENT_RETENTION_DAYS": None}}
    ask(service, "favourite drink", session_fact, "s1", times=1)
    service.flush_recall_log()
    RecallEvent.objects.update(created_at=timezone.now() - timedelta(days=3650))
    assert service.prune().deleted["recall_events"] == 0 and RecallEvent.objects.count() == 1


@pytest.mark.parametrize("field", ["min_recalls", "min_sessions"])
@pytest.mark.parametrize("value", [0, -1, "3", True])
def test_bad_thresholds_name_the_argument_and_change_nothing(service, session_fact, field, value):
    ask(service, "favourite drink", session_fact, "s1", times=3)
    with pytest.raises(InvalidMemoryArgument, match=field):
        service.promote(**{field: value})
    assert not Promotion.objects.exists()


def test_the_promote_command(service, session_fact, capsys):
    ask(service, "favourite drink", session_fact, "s1", times=3)
    call_command("memory", "promote", "--dry-run", "--json")
    dry = json.loads(capsys.readouterr().out)
    assert dry["dry_run"] and len(dry["promoted"]) == 1 and not Promotion.objects.exists()
    call_command("memory", "promote")
    out = capsys.readouterr().out
    assert "session_fact" in out and "favourite_drink (user)" in out
    assert Promotion.objects.count() == 1
