"""Limits and pruning: writes that cross a limit evict the least valuable rows; `prune` catches up; SQLite shrinks."""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from langgraph.store.base import PutOp

from memory.models import Episode, Fact, Procedure, StoreItem
from memory.signals import prune_requested

pytestmark = pytest.mark.django_db

AGENT = "support-bot"


def limits(settings, **values):
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), "LIMITS": values}


def keys(**filters):
    return set(Fact.objects.filter(**filters).values_list("key", flat=True))


def age(model, pk, days, **fields):
    """Arrange a row's history: move its timestamps `days` into the past."""
    past = timezone.now() - timedelta(days=days)
    names = {Fact: ["updated_at"], Episode: ["started_at"], Procedure: ["created_at"]}[model]
    model.objects.filter(pk=pk).update(**{n: past for n in names}, **fields)


# ------------------------------------------------------------------ facts


def test_a_write_over_the_limit_evicts_the_least_valuable_fact(service, user_factory, settings):
    limits(settings, MAX_FACTS=3)
    ada = user_factory("ada")
    trusted = service.set_fact("home_city", "Porto", scope="user", user_id=ada.pk, confidence=0.7).fact
    service.set_fact("home_city", "Porto", scope="user", user_id=ada.pk)  # confirmed: 0.7 -> 0.76
    doubtful = service.set_fact("maybe_pet", "cat?", scope="user", user_id=ada.pk, confidence=0.3).fact
    service.set_fact("language", "pt", scope="user", user_id=ada.pk, confidence=0.9)
    # The confirmed fact is old and never recalled; the doubtful one was recalled just now.
    age(Fact, trusted.pk, 400)
    service.get_fact("maybe_pet", user_id=ada.pk)
    service.flush_access_counts()
    write = service.set_fact("timezone", "UTC", scope="user", user_id=ada.pk, confidence=0.8)
    assert write.action == "created"
    assert keys(user=ada) == {"home_city", "language", "timezone"}
    assert not Fact.objects.filter(pk=doubtful.pk).exists()


def test_within_a_confidence_tier_the_longest_unused_goes_first(service, settings):
    limits(settings, MAX_FACTS=2)
    old = service.set_fact("a", 1, scope="agent", agent_id=AGENT, confidence=0.81).fact
    used = service.set_fact("b", 2, scope="agent", agent_id=AGENT, confidence=0.82).fact
    age(Fact, old.pk, 30)
    age(Fact, used.pk, 60, last_accessed=timezone.now() - timedelta(days=1))
    service.set_fact("c", 3, scope="agent", agent_id=AGENT, confidence=0.85)
    assert keys(agent_id=AGENT) == {"b", "c"}


def test_the_fact_just_written_is_never_evicted_by_its_own_write(service, settings):
    limits(settings, MAX_FACTS=1)
    service.set_fact("solid", "yes", confidence=1.0)
    write = service.set_fact("shaky", "perhaps", confidence=0.1)
    assert keys() == {"shaky"}
    assert write.fact.pk == Fact.objects.get().pk


def test_limits_are_per_owner_and_per_agent_overrides_apply(service, user_factory, settings):
    limits(settings, MAX_FACTS=2, PER_AGENT={"tiny-bot": {"MAX_FACTS": 1}})
    ada, bob = user_factory("ada"), user_factory("bob")
    for i in range(3):
        service.set_fact(f"ada_{i}", i, scope="user", user_id=ada.pk)
        service.set_fact(f"bob_{i}", i, scope="user", user_id=bob.pk)
        service.set_fact(f"tiny_{i}", i, scope="agent", agent_id="tiny-bot")
        service.set_fact(f"big_{i}", i, scope="agent", agent_id="big-bot")
    assert Fact.objects.filter(user=ada).count() == 2
    assert Fact.objects.filter(user=bob).count() == 2
    assert keys(agent_id="tiny-bot") == {"tiny_2"}
    assert Fact.objects.filter(agent_id="big-bot").count() == 2


def test_updates_and_confirmations_do_not_count_as_new_rows(service, settings, capture_data_queries):
    limits(settings, MAX_FACTS=1)
    service.set_fact("only", "one")
    service.set_fact("only", "one")
    service.set_fact("only", "two")
    assert Fact.objects.get().value == "two"


def test_a_limit_costs_one_count_per_created_fact(service, settings, capture_data_queries, keyword_only):
    limits(settings, MAX_FACTS=100)
    with capture_data_queries() as q:
        service.set_fact("city", "Porto")
    # lookup, insert, the count (a create keeps no history row: the fact's row is its current version)
    assert len(q.data) == 3, q.data
    assert "COUNT" in q.data[-1].upper()


def test_a_persons_facts_are_capped_by_default_and_a_new_key_past_the_cap_is_refused(service, user_factory, settings):
    from memory.conf import memory_settings
    from memory.exceptions import LimitReached
    from memory.models import FactHistory

    assert memory_settings.LIMITS["MAX_FACTS_PER_USER"] == 1_000  # on without any setting
    limits(settings, MAX_FACTS_PER_USER=2)
    ada, bob = user_factory("ada"), user_factory("bob")
    service.set_fact("name", "Ada", scope="user", user_id=ada.pk)
    service.set_fact("city", "Porto", scope="user", user_id=ada.pk)
    with pytest.raises(LimitReached) as caught:
        service.set_fact("pet", "cat", scope="user", user_id=ada.pk)
    assert (caught.value.field, caught.value.limit, caught.value.value) == ("key", "MAX_FACTS_PER_USER", 2)
    assert "MAX_FACTS_PER_USER" in str(caught.value) and "'pet' was not stored" in str(caught.value)
    # Nothing of the refused write stays (no row, no version); what she said before is all kept.
    assert keys(user=ada) == {"name", "city"} and not FactHistory.objects.filter(key="pet").exists()
    # Her known keys still change; other people, the agent and everyone's facts are not hers to count.
    assert service.set_fact("city", "Lisbon", scope="user", user_id=ada.pk).action == "updated"
    assert service.set_fact("pet", "dog", scope="user", user_id=bob.pk).action == "created"
    assert service.set_fact("pet", "cat", scope="agent", agent_id=AGENT).action == "created"
    assert service.set_fact("pet", "cat").action == "created"
    # Without the cap (None) she may add more.
    limits(settings, MAX_FACTS_PER_USER=None)
    assert service.set_fact("pet", "cat", scope="user", user_id=ada.pk).action == "created"


# ------------------------------------------------------------------ episodes and procedures


def test_consolidated_episodes_go_before_unconsolidated_ones(service, settings):
    limits(settings, MAX_EPISODES=2)
    oldest = service.start_episode(agent_id=AGENT)
    consolidated = service.start_episode(agent_id=AGENT)
    Episode.objects.filter(pk=consolidated.pk).update(processed_for_facts=True)
    age(Episode, oldest.pk, 10)
    newest = service.start_episode(agent_id=AGENT)
    assert set(Episode.objects.values_list("pk", flat=True)) == {oldest.pk, newest.pk}
    service.start_episode(agent_id="other-agent")  # another agent's episodes are counted apart
    assert Episode.objects.filter(agent_id=AGENT).count() == 2


def test_a_pruned_episode_leaves_its_facts_in_place(service, settings):
    limits(settings, MAX_EPISODES=1)
    source = service.start_episode(agent_id=AGENT)
    service.complete_episode(source.pk, success=True)
    fact = service.set_fact("pin", "1", source_episode_id=source.pk, provenance="consolidation").fact
    service.start_episode(agent_id=AGENT)
    fact.refresh_from_db()
    assert fact.source_episode_id is None and fact.provenance == "consolidation"


def test_inactive_and_failing_procedures_go_first(service, settings):
    limits(settings, MAX_PROCEDURES=2)
    good = service.save_procedure("good", agent_id=AGENT)
    for _ in range(3):
        service.record_procedure_use(good.pk, success=True)
    bad = service.save_procedure("bad", agent_id=AGENT)
    service.record_procedure_use(bad.pk, success=False)
    service.save_procedure("untried", agent_id=AGENT)
    assert set(Procedure.objects.values_list("name", flat=True)) == {"good", "untried"}
    retired = service.save_procedure("retired", agent_id=AGENT, is_active=False)
    assert retired.pk  # it was written; then the new row survives its own write...
    service.save_procedure("next", agent_id=AGENT)  # ...and goes first on the next one
    assert set(Procedure.objects.values_list("name", flat=True)) == {"good", "next"}


# ------------------------------------------------------------------ prune


def test_prune_brings_every_group_within_lowered_limits(service, user_factory, settings):
    ada = user_factory("ada")
    for i in range(5):
        service.set_fact(f"k{i}", i, scope="user", user_id=ada.pk, confidence=0.5 + i / 10)
        service.start_episode(agent_id=AGENT)
    limits(settings, MAX_FACTS=2, MAX_EPISODES=3)
    expected = {
        "facts": 3,
        "episodes": 2,
        "procedures": 0,
        "fact_versions": 0,
        "store_items": 0,
        "recall_events": 0,
        "workflow runs": 0,  # workflows joins prune through prune_requested (old runs)
    }
    assert service.prune(dry_run=True).deleted == expected
    assert Fact.objects.count() == 5 and Episode.objects.count() == 5
    assert service.prune().deleted == expected
    assert keys() == {"k3", "k4"}  # the most confident kept
    assert Episode.objects.count() == 3
    assert service.prune().total == 0


def test_prune_of_one_agent_leaves_the_others(service, settings):
    for _i in range(3):
        service.start_episode(agent_id="a")
        service.start_episode(agent_id="b")
    limits(settings, MAX_EPISODES=1)
    assert service.prune(agent_id="a").deleted["episodes"] == 2
    assert Episode.objects.filter(agent_id="b").count() == 3


def test_other_apps_join_a_prune_through_the_signal(service):
    calls = []

    def prune_threads(sender, agent_id, dry_run, **kwargs):
        calls.append((agent_id, dry_run))
        return {"threads": 4, "checkpoints": 10}

    prune_requested.connect(prune_threads)
    try:
        report = service.prune(agent_id=AGENT, dry_run=True)
    finally:
        prune_requested.disconnect(prune_threads)
    assert calls == [(AGENT, True)]
    assert report.deleted["threads"] == 4 and report.deleted["checkpoints"] == 10


# ------------------------------------------------------------------ LangGraph store items


def stored(namespace):
    return set(StoreItem.objects.filter(namespace=namespace).values_list("key", flat=True))


def test_a_store_namespace_over_its_limit_loses_its_least_recently_written_items(settings):
    from workflows.store import EngramStore

    limits(settings, MAX_STORE_ITEMS=2, PER_AGENT={AGENT: {"MAX_STORE_ITEMS": 1}})
    store = EngramStore()
    for key in ("tea", "figs", "rain"):
        store.put(("users", "ada", "memories"), key, {"text": key})
        store.put(("users", "bob", "memories"), key, {"text": key})
    store.put(("users", "ada", "memories"), "tea", {"text": "green tea"})  # written again: the newest
    store.put(("users", "ada", "memories"), "sun", {"text": "sun"})
    assert stored("users.ada.memories") == {"tea", "sun"}
    assert stored("users.bob.memories") == {"figs", "rain"}  # a limit per namespace
    store.batch([PutOp(("agents", AGENT, "notes"), k, {"text": k}) for k in ("a", "b", "c")])
    assert stored(f"agents.{AGENT}.notes") == {"c"}  # the agent's own limit; a batch keeps its last


def test_prune_brings_store_namespaces_within_a_lowered_limit(service, settings):
    from workflows.store import EngramStore

    store = EngramStore()
    for key in ("tea", "figs", "rain"):
        store.put(("users", "ada", "memories"), key, {"text": key})
    limits(settings, MAX_STORE_ITEMS=1)
    assert service.prune(dry_run=True).deleted["store_items"] == 2
    assert service.prune().deleted["store_items"] == 2
    assert stored("users.ada.memories") == {"rain"}


def test_a_bad_limit_setting_names_itself(service, settings):
    limits(settings, MAX_FACTS="lots")
    with pytest.raises(ValueError, match="MAX_FACTS"):
        service.set_fact("k", "v")
    assert not Fact.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_sqlite_gives_pruned_space_back(service, settings):
    if connection.vendor != "sqlite":
        pytest.skip("PostgreSQL reclaims space with autovacuum")
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA auto_vacuum")
        assert cursor.fetchone()[0] == 2  # INCREMENTAL
    for i in range(300):
        service.set_fact(f"bulky_{i}", "x" * 2000, scope="agent", agent_id=AGENT)
    limits(settings, MAX_FACTS=10)
    report = service.prune()
    assert report.deleted["facts"] == 290
    assert report.reclaimed_pages > 100
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA freelist_count")
        assert cursor.fetchone()[0] == 0
