"""Memory users through MemoryService: identities, linking, merges, user context, conversation counts."""

import datetime
import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from memory.exceptions import InvalidMemoryArgument, MemoryConflict, MemoryNotFound
from memory.models import ChannelIdentity, Episode, Fact, MemoryUser
from memory.signals import users_merged

pytestmark = pytest.mark.django_db


# ------------------------------------------------------------------ get_or_create_user


def test_get_or_create_user_creates_once(service):
    user, created = service.get_or_create_user("telegram", "1001", display_name="Ann")
    assert created is True
    assert (user.canonical_id, user.display_name) == ("telegram:1001", "Ann")
    assert user.last_seen is not None
    again, created = service.get_or_create_user("telegram", "1001", display_name="Someone else")
    assert created is False
    assert again.pk == user.pk and again.display_name == "Ann"
    assert MemoryUser.objects.count() == 1
    assert list(ChannelIdentity.objects.values_list("user_id", "channel", "external_id")) == [
        (user.pk, "telegram", "1001")
    ]


def test_int_external_ids_are_strings(service):
    user, created = service.get_or_create_user("telegram", 1001)
    assert created
    same, created = service.get_or_create_user("telegram", "1001")
    assert (same.pk, created) == (user.pk, False)
    assert ChannelIdentity.objects.get(user=user).external_id == "1001"


def test_channel_is_case_insensitive(service):
    user, _ = service.get_or_create_user("Telegram", "1001")
    for channel in ("telegram", "TELEGRAM", " telegram "):
        same, created = service.get_or_create_user(channel, "1001")
        assert (same.pk, created) == (user.pk, False)
    assert ChannelIdentity.objects.get().channel == "telegram"


def test_same_external_id_on_another_channel_is_another_user(service):
    a, _ = service.get_or_create_user("telegram", "42")
    b, created = service.get_or_create_user("whatsapp", "42")
    assert created and a.pk != b.pk


def test_a_channel_name_cannot_contain_the_canonical_id_separator(service):
    """Canonical ids are "<channel>:<external id>", so a ':' in a channel could make two identities
    collide (("slack:t1", "u2") and ("slack", "t1:u2")): such a channel is refused, and ids may hold ':'."""
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.get_or_create_user("slack:t1", "u2")
    assert exc.value.field == "channel"
    user, created = service.get_or_create_user("slack", "t1:u2")
    assert created and user.canonical_id == "slack:t1:u2"
    assert MemoryUser.objects.count() == 1


@pytest.mark.parametrize(
    "channel, external_id, field",
    [
        ("", "1", "channel"),
        ("  ", "1", "channel"),
        (None, "1", "channel"),
        ("telegram", "", "external_id"),
        ("telegram", None, "external_id"),
        ("telegram", 1.5, "external_id"),
        ("c" * 51, "1", "channel"),
    ],
)
def test_get_or_create_user_bad_arguments(service, channel, external_id, field):
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.get_or_create_user(channel, external_id)
    assert exc.value.field == field
    assert MemoryUser.objects.count() == 0 and ChannelIdentity.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_first_contacts_make_one_user(service, run_in_threads):
    results = run_in_threads(lambda n: service.get_or_create_user("telegram", "777", display_name=f"T{n}"), 8)
    assert len({user.pk for user, _ in results}) == 1
    assert [created for _, created in results].count(True) == 1
    assert MemoryUser.objects.count() == 1 and ChannelIdentity.objects.count() == 1


# ------------------------------------------------------------------ link_identity


def test_link_identity_then_lookup_by_it(service, user_factory):
    user = user_factory("ann", channel="telegram")
    identity = service.link_identity(user.pk, "Email", "ann@example.org")
    assert (identity.user_id, identity.channel, identity.external_id) == (user.pk, "email", "ann@example.org")
    found, created = service.get_or_create_user("email", "ann@example.org")
    assert (found.pk, created) == (user.pk, False)
    assert MemoryUser.objects.count() == 1


def test_link_identity_twice_to_the_same_user_is_harmless(service, user_factory):
    user = user_factory()
    first = service.link_identity(user.pk, "email", "a@example.org")
    second = service.link_identity(user.pk, "email", "a@example.org")
    assert first.pk == second.pk
    assert ChannelIdentity.objects.filter(user=user).count() == 2


def test_link_identity_of_another_user_is_refused(service, user_factory):
    ann = user_factory("ann", channel="telegram")
    bob = user_factory("bob", channel="telegram")
    with pytest.raises(InvalidMemoryArgument) as exc:
        service.link_identity(bob.pk, "telegram", "ann")
    assert exc.value.field == "external_id"
    assert ChannelIdentity.objects.get(channel="telegram", external_id="ann").user_id == ann.pk
    assert ChannelIdentity.objects.filter(user=bob).count() == 1


def test_link_identity_to_unknown_user(service):
    with pytest.raises(MemoryNotFound):
        service.link_identity(987654, "email", "x@example.org")
    assert ChannelIdentity.objects.count() == 0


# ------------------------------------------------------------------ merges


def populate(service, user, tag):
    service.set_fact(f"{tag}_city", f"{tag} city", scope="user", user_id=user.pk)
    episode = service.start_episode(agent_id="agent", user_id=user.pk, trigger_type=f"{tag}-trigger")
    return episode


def test_merge_moves_identities_facts_and_episodes(service, user_factory):
    ann = user_factory("ann", channel="telegram", display_name="")
    ann_too = user_factory("ann@example.org", channel="email", display_name="Ann")
    service.count_conversation(ann.pk)
    service.count_conversation(ann_too.pk)
    service.count_conversation(ann_too.pk)
    ep_a = populate(service, ann, "a")
    ep_b = populate(service, ann_too, "b")

    received = []

    def receiver(sender, source_id, target_id, **kwargs):
        received.append((source_id, target_id))

    users_merged.connect(receiver)
    try:
        survivor = service.merge_users(ann.pk, ann_too.pk)
    finally:
        users_merged.disconnect(receiver)

    assert survivor.pk == ann_too.pk
    assert received == [(ann.pk, ann_too.pk)]
    assert survivor.display_name == "Ann"
    assert survivor.total_conversations == 3
    ann.refresh_from_db()
    assert ann.merged_into_id == survivor.pk and ann.merged_at is not None
    assert set(ChannelIdentity.objects.filter(user=survivor).values_list("channel", "external_id")) == {
        ("telegram", "ann"),
        ("email", "ann@example.org"),
    }
    assert not ChannelIdentity.objects.filter(user=ann).exists()
    assert sorted(Fact.objects.filter(user=survivor).values_list("key", flat=True)) == ["a_city", "b_city"]
    assert not Fact.objects.filter(user=ann).exists()
    assert set(Episode.objects.filter(user=survivor).values_list("id", flat=True)) == {ep_a.pk, ep_b.pk}


def assert_lookups_land_on(service, survivor, stale_id, identity, fact_keys, episode_ids):
    user, created = service.get_or_create_user(*identity)
    assert (user.pk, created) == (survivor.pk, False)
    assert service.resolve_user(stale_id).pk == survivor.pk
    for key in fact_keys:
        fact = service.get_fact(key, user_id=stale_id)
        assert fact is not None and fact.user_id == survivor.pk
    assert sorted(f.key for f in service.list_facts(user_id=stale_id)) == sorted(fact_keys)
    assert sorted(f.key for f in service.search_facts("city", user_id=stale_id)) == sorted(fact_keys)
    assert sorted(f.key for f in service.user_facts(stale_id)) == sorted(fact_keys)
    assert {e.pk for e in service.recent_episodes(user_id=stale_id)} == set(episode_ids)
    context = service.user_context(stale_id)
    assert context.user_id == survivor.pk
    assert sorted(f["key"] for f in context.facts) == sorted(fact_keys)
    assert context.fact_count == len(fact_keys)
    assert context.episode_count == len(episode_ids)


def test_lookups_by_the_old_user_after_a_merge(service, user_factory):
    a = user_factory("a", channel="telegram")
    b = user_factory("b", channel="email")
    eps = [populate(service, a, "a").pk, populate(service, b, "b").pk]
    service.merge_users(a.pk, b.pk)
    assert_lookups_land_on(service, b, a.pk, ("telegram", "a"), ["a_city", "b_city"], eps)


def test_lookups_after_a_chain_of_merges(service, user_factory):
    a = user_factory("a", channel="telegram")
    b = user_factory("b", channel="email")
    c = user_factory("c", channel="chat")
    eps = [populate(service, u, tag).pk for u, tag in ((a, "a"), (b, "b"), (c, "c"))]
    service.merge_users(a.pk, b.pk)
    service.merge_users(b.pk, c.pk)
    a.refresh_from_db()
    assert a.merged_into_id == c.pk  # merged users always point at a survivor
    keys = ["a_city", "b_city", "c_city"]
    assert_lookups_land_on(service, c, a.pk, ("telegram", "a"), keys, eps)
    assert_lookups_land_on(service, c, b.pk, ("email", "b"), keys, eps)


def test_writes_with_the_old_user_id_go_to_the_survivor(service, user_factory):
    a, b = user_factory(), user_factory()
    service.merge_users(a.pk, b.pk)
    write = service.set_fact("tz", "UTC", scope="user", user_id=a.pk)
    assert write.action == "created"
    assert Fact.objects.get(key="tz").user_id == b.pk
    assert service.set_fact("tz", "UTC", scope="user", user_id=b.pk).action == "confirmed"
    assert Fact.objects.filter(key="tz").count() == 1
    episode = service.start_episode(user_id=a.pk)
    assert episode.user_id == b.pk
    service.link_identity(a.pk, "email", "late@example.org")
    assert ChannelIdentity.objects.get(external_id="late@example.org").user_id == b.pk


def test_merge_same_value_is_kept_once_with_confirmations_summed(service, user_factory):
    source, target = user_factory(), user_factory()
    for _ in range(3):  # created, then confirmed twice
        service.set_fact("tz", "UTC", scope="user", user_id=source.pk, confidence=0.5)
    service.set_fact("tz", "UTC", scope="user", user_id=target.pk, confidence=0.9)
    service.set_fact("tz", "UTC", scope="user", user_id=target.pk)  # confirmed once
    src_conf = Fact.objects.get(user=source, key="tz").confidence
    tgt_conf = Fact.objects.get(user=target, key="tz").confidence

    service.merge_users(source.pk, target.pk)
    facts = list(Fact.objects.filter(key="tz"))
    assert len(facts) == 1
    fact = facts[0]
    assert (fact.user_id, fact.value) == (target.pk, "UTC")
    # Five writes of one value in all, as if made to one owner: one creation, four confirmations.
    assert fact.times_confirmed == 2 + 1 + 1
    assert fact.times_contradicted == 0
    assert fact.confidence == pytest.approx(max(src_conf, tgt_conf))


@pytest.mark.parametrize("newer", ["source", "target"])
def test_merge_different_values_keep_the_more_recent(service, user_factory, newer):
    source, target = user_factory(), user_factory()
    service.set_fact("tz", "Europe/Lisbon", scope="user", user_id=source.pk)
    service.set_fact("tz", "Europe/Oslo", scope="user", user_id=target.pk)
    now = timezone.now()
    old, new = now - datetime.timedelta(days=2), now - datetime.timedelta(days=1)
    Fact.objects.filter(user=source).update(updated_at=new if newer == "source" else old)
    Fact.objects.filter(user=target).update(updated_at=new if newer == "target" else old)

    service.merge_users(source.pk, target.pk)
    facts = list(Fact.objects.filter(key="tz"))
    assert len(facts) == 1
    fact = facts[0]
    assert fact.user_id == target.pk
    assert fact.value == ("Europe/Lisbon" if newer == "source" else "Europe/Oslo")
    assert fact.times_contradicted == 1
    assert service.get_fact("tz", user_id=source.pk).pk == fact.pk
    assert [f.pk for f in service.search_facts("europe", user_id=target.pk)] == [fact.pk]
    loser = "oslo" if newer == "source" else "lisbon"
    assert service.search_facts(loser, user_id=target.pk) == []


def test_merge_into_itself_is_refused(service, user_factory):
    a, b = user_factory(), user_factory()
    with pytest.raises(InvalidMemoryArgument):
        service.merge_users(a.pk, a.pk)
    service.merge_users(a.pk, b.pk)
    with pytest.raises(InvalidMemoryArgument):  # a is b now
        service.merge_users(a.pk, b.pk)
    with pytest.raises(InvalidMemoryArgument):
        service.merge_users(b.pk, a.pk)
    b.refresh_from_db()
    assert b.merged_into_id is None


def test_merge_unknown_user(service, user_factory):
    a = user_factory()
    with pytest.raises(MemoryNotFound):
        service.merge_users(a.pk, 987654)
    with pytest.raises(MemoryNotFound):
        service.resolve_user(987654)


# ------------------------------------------------------------------ user context


def test_user_context(service, user_factory):
    ann = user_factory("ann", channel="telegram", display_name="Ann")
    service.link_identity(ann.pk, "email", "ann@example.org")
    service.set_fact(
        "language", "Portuguese", scope="user", user_id=ann.pk, fact_type="user_preference", confidence=0.9
    )
    service.set_fact("employer", "ACME", scope="user", user_id=ann.pk, confidence=0.7)
    service.set_fact("global_fact", "not hers")
    episodes = [service.start_episode(agent_id="agent", user_id=ann.pk, trigger_type=f"t{i}") for i in range(3)]
    service.complete_episode(episodes[0].pk, success=True, summary="first run")
    service.count_conversation(ann.pk)
    service.count_conversation(ann.pk)

    context = service.user_context(ann.pk)
    assert context.user_id == ann.pk
    assert context.canonical_id == "telegram:ann"
    assert context.display_name == "Ann"
    assert context.identities == [
        {"channel": "email", "external_id": "ann@example.org"},
        {"channel": "telegram", "external_id": "ann"},
    ]
    assert context.preferences == {"language": "Portuguese"}
    assert context.facts == [
        {"key": "language", "value": "Portuguese", "fact_type": "user_preference", "confidence": 0.9},
        {"key": "employer", "value": "ACME", "fact_type": "world_knowledge", "confidence": 0.7},
    ]
    assert [e["id"] for e in context.recent_episodes] == [e.pk for e in reversed(episodes)]
    assert context.recent_episodes[-1]["summary"] == "first run"
    assert context.recent_episodes[-1]["success"] is True
    assert (context.fact_count, context.episode_count, context.total_conversations) == (2, 3, 2)
    assert context.last_seen is not None
    data = context.as_dict()
    assert data["last_seen"] == context.last_seen.isoformat()
    assert "extra" not in data


def test_user_context_shows_an_episode_without_summary_by_its_conversation(service, user_factory):
    """A workflow's run records its messages and no summary; the context still says what it was about."""
    ann = user_factory("ann", channel="telegram")
    service.record_episode(
        started_at=timezone.now(),
        success=True,
        user_id=ann.pk,
        conversation=[{"role": "user", "content": "I  moved to\nLisbon"}, {"role": "assistant", "content": "Noted."}],
    )
    for context in (service.user_context(ann.pk), service.identify("telegram", "ann").context):
        assert context.recent_episodes[0]["summary"] == "said 'I moved to Lisbon'; replied 'Noted.'"


def test_user_context_is_at_most_four_queries(service, user_factory, django_assert_max_num_queries):
    ann = user_factory()
    service.set_fact("language", "pt", scope="user", user_id=ann.pk, fact_type="user_preference")
    service.start_episode(user_id=ann.pk)
    with django_assert_max_num_queries(4):
        context = service.user_context(ann.pk)
    assert context.fact_count == 1 and context.episode_count == 1


def test_user_context_by_an_old_id_is_at_most_four_queries(service, user_factory, django_assert_max_num_queries):
    """The README: a lookup by an old id follows at most one hop, inside the same query."""
    old, survivor = user_factory(), user_factory()
    service.set_fact("language", "pt", scope="user", user_id=old.pk, fact_type="user_preference")
    service.merge_users(old.pk, survivor.pk)
    with django_assert_max_num_queries(4):
        context = service.user_context(old.pk)
    assert context.user_id == survivor.pk and context.preferences == {"language": "pt"}


def test_user_context_unknown_user(service):
    with pytest.raises(MemoryNotFound):
        service.user_context(987654)


# ------------------------------------------------------------------ conversation counts


def test_count_conversation(service, user_factory):
    ann = user_factory()
    MemoryUser.objects.filter(pk=ann.pk).update(last_seen=None)
    assert service.conversation_count(ann.pk) == 0
    before = timezone.now()
    service.count_conversation(ann.pk)
    service.count_conversation(ann.pk)
    ann.refresh_from_db()
    assert ann.total_conversations == 2
    assert ann.last_seen is not None and ann.last_seen >= before
    assert service.conversation_count(ann.pk) == 2


def test_count_conversation_with_the_old_user_id_counts_for_the_survivor(service, user_factory):
    a, b = user_factory(), user_factory()
    service.merge_users(a.pk, b.pk)
    service.count_conversation(a.pk)
    assert service.conversation_count(b.pk) == 1
    assert service.conversation_count(a.pk) == 1


# ------------------------------------------------------- concurrent merges (bench.merges runs 40 of each)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["chain", "swap"])
def test_concurrent_merges_keep_the_merge_rule(service, kind):
    """A->B while B->C, and A->B while B->A, started together: merged_into always names a survivor,
    every old id still finds its facts, forgetting the survivor forgets everyone, and the losing
    merge of a swap is a MemoryConflict (409), never a raw IntegrityError or deadlock."""
    from bench.merges import trial

    for _ in range(8):
        found = trial(service, kind)
        assert found == {
            "broken_chains": 0,
            "raw_errors": 0,
            "refused": 1 if kind == "swap" else 0,
            "lost_facts": 0,
            "leftovers": 0,
            "errors": [],
        }


def test_merge_with_a_merged_user_merges_into_its_survivor(service, user_factory):
    a, b, c = user_factory(), user_factory(), user_factory()
    service.merge_users(b.pk, c.pk)
    survivor = service.merge_users(a.pk, b.pk)  # b is c now: a goes to c, not to the merged-away b
    assert survivor.pk == c.pk
    a.refresh_from_db()
    assert a.merged_into_id == c.pk
    with pytest.raises(MemoryConflict):
        service.merge_users(c.pk, a.pk)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("write", ["fact", "episode"])
def test_a_write_by_the_old_id_during_a_merge_lands_on_the_survivor(service, user_factory, write):
    """A write that starts while a merge of its user is in flight waits for it and goes to the survivor."""
    a, b = user_factory(), user_factory()
    inside = threading.Event()

    def hold_the_merge_open(sender, **kwargs):  # users_merged is sent inside the merge transaction
        inside.set()
        time.sleep(0.5)

    users_merged.connect(hold_the_merge_open, dispatch_uid="test-slow-merge")
    try:
        merging = threading.Thread(target=lambda: (service.merge_users(a.pk, b.pk), connection.close()))
        merging.start()
        assert inside.wait(10)
        if write == "fact":
            row = Fact.objects.get(pk=service.set_fact("late", "x", scope="user", user_id=a.pk).fact.pk)
        else:
            row = Episode.objects.get(
                pk=service.record_episode(started_at=timezone.now(), user_id=a.pk, success=True).pk
            )
        merging.join(timeout=30)
    finally:
        users_merged.disconnect(dispatch_uid="test-slow-merge")
    assert row.user_id == b.pk
