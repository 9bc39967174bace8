"""MemoryService calls made for workflows: identify, record_episode, delete_users (and users_deleting)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from memory.exceptions import InvalidMemoryArgument
from memory.models import ChannelIdentity, Episode, Fact, MemoryUser
from memory.signals import users_deleting


def test_identify_creates_once_and_counts_conversations(service):
    first = service.identify("telegram", 42, display_name="Ada")
    assert first.created and first.context.total_conversations == 1 and first.context.display_name == "Ada"
    second = service.identify("telegram", "42")
    assert not second.created and second.context.user_id == first.context.user_id
    assert second.context.total_conversations == 2
    assert MemoryUser.objects.get().total_conversations == 2 and ChannelIdentity.objects.count() == 1


def test_identify_fills_a_missing_display_name_only(service):
    service.identify("chat", "u1")
    assert service.identify("chat", "u1", display_name="Ann").context.display_name == "Ann"
    assert service.identify("chat", "u1", display_name="Other").context.display_name == "Ann"


def test_identify_context_counts_beyond_what_it_lists(service, settings):
    settings.MEMORY = {**settings.MEMORY, "CONTEXT_FACTS": 2, "RECENT_EPISODES": 1}
    user = service.identify("chat", "u1").context.user_id
    for key in "abc":
        service.set_fact(key, key, scope="user", user_id=user)
    for _ in range(3):
        service.record_episode(started_at=timezone.now(), user_id=user, success=True)
    context = service.identify("chat", "u1").context
    assert len(context.facts) == 2 and context.fact_count == 3
    assert len(context.recent_episodes) == 1 and context.episode_count == 3


def test_identify_follows_a_merge(service):
    ada = service.identify("telegram", 42).context.user_id
    mail = service.identify("email", "ada@example.com").context.user_id
    service.merge_users(mail, ada)
    context = service.identify("email", "ada@example.com").context
    assert context.user_id == ada
    assert {i["channel"] for i in context.identities} == {"telegram", "email"}


def test_identify_rejects_bad_channels(service):
    with pytest.raises(InvalidMemoryArgument) as caught:
        service.identify("tele:gram", 1)
    assert caught.value.field == "channel" and not MemoryUser.objects.exists()


def test_record_episode_keeps_the_run_start_and_follows_merges(service):
    a, _ = service.get_or_create_user("chat", "a")
    b, _ = service.get_or_create_user("chat", "b")
    service.merge_users(a.pk, b.pk)
    started = timezone.now() - timedelta(seconds=2)
    episode = service.record_episode(started_at=started, user_id=a.pk, success=True, summary="ran")
    row = Episode.objects.get(pk=episode.pk)
    assert row.user_id == b.pk and row.started_at == started and row.duration_ms >= 2000
    assert (episode.user_id, episode.started_at) == (b.pk, started)  # the object says what the row holds


def test_record_episode_with_an_unknown_user_writes_nothing(service):
    with pytest.raises(InvalidMemoryArgument) as caught:
        service.record_episode(started_at=timezone.now(), user_id=12345, success=True)
    assert caught.value.field == "user_id" and not Episode.objects.exists()


def test_delete_users_takes_merged_users_and_everything_owned(service):
    a, _ = service.get_or_create_user("chat", "a")
    b, _ = service.get_or_create_user("chat", "b")
    keep, _ = service.get_or_create_user("chat", "keep")
    service.merge_users(a.pk, b.pk)
    service.set_fact("k", 1, scope="user", user_id=b.pk)
    service.record_episode(started_at=timezone.now(), user_id=b.pk, success=True)
    seen = []
    receiver = lambda sender, user_ids, **kw: seen.append(sorted(user_ids))  # noqa: E731
    users_deleting.connect(receiver)
    try:
        assert service.delete_users([b.pk], cascade=True).deleted == 1  # and `a`, merged into b
    finally:
        users_deleting.disconnect(receiver)
    assert seen == [sorted([a.pk, b.pk])]
    assert list(MemoryUser.objects.values_list("pk", flat=True)) == [keep.pk]
    assert not Fact.objects.exists() and not Episode.objects.exists()


def test_a_failing_users_deleting_receiver_deletes_nothing(service):
    a, _ = service.get_or_create_user("chat", "a")

    def refuse(sender, user_ids, **kwargs):
        raise RuntimeError("cannot delete their threads")

    users_deleting.connect(refuse)
    try:
        with pytest.raises(RuntimeError):
            service.delete_users([a.pk], cascade=True)
    finally:
        users_deleting.disconnect(refuse)
    assert MemoryUser.objects.filter(pk=a.pk).exists()


@pytest.mark.parametrize("ids", [[], "1", [0], [True]])
def test_delete_users_refuses_bad_ids(service, ids):
    with pytest.raises(InvalidMemoryArgument) as caught:
        service.delete_users(ids)
    assert caught.value.field.startswith("ids")


@pytest.mark.django_db(transaction=True)
def test_identify_the_same_new_user_at_once(run_in_threads):
    from memory.service import MemoryService

    results = run_in_threads(lambda n: MemoryService().identify("telegram", 4242), 6)
    assert sum(r.created for r in results) == 1
    assert len({r.context.user_id for r in results}) == 1
    assert MemoryUser.objects.get().total_conversations == 6 and ChannelIdentity.objects.count() == 1
