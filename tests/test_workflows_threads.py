"""The public thread API: list threads and checkpoints, delete threads (rows and checkpoints), retention."""

import pytest

from memory.models import MemoryUser
from tests.workflow_helpers import saved as checkpoints
from tests.workflow_helpers import talk
from workflows.conversations import threads
from workflows.models import Thread


@pytest.fixture
def two_threads(demo_workflow):
    ann, bob = talk(demo_workflow, "ann"), talk(demo_workflow, "bob")
    return ann.thread_id, bob.thread_id


def test_list_threads_and_their_checkpoints(demo_workflow, two_threads, django_assert_num_queries):
    ann_thread, bob_thread = two_threads
    with django_assert_num_queries(1):
        listed = threads.list_threads(workflow_id=demo_workflow.pk)
        assert {t.thread_id for t in listed} == {ann_thread, bob_thread}
        assert {t.user.canonical_id for t in listed} == {"chat:ann", "chat:bob"}
    ann = MemoryUser.objects.get(canonical_id="chat:ann")
    assert [t.thread_id for t in threads.list_threads(user_ids=[ann.pk])] == [ann_thread]
    items = threads.list_checkpoints(ann_thread)
    assert items and items[0].message_count == 2 and items[0].created_at is not None
    assert [i.checkpoint_id for i in items] == sorted((i.checkpoint_id for i in items), reverse=True)


def test_delete_threads_removes_rows_and_checkpoints(two_threads, django_capture_on_commit_callbacks):
    ann_thread, bob_thread = two_threads
    with django_capture_on_commit_callbacks(execute=True):
        assert threads.delete_threads([ann_thread, "untracked:direct:1"]) == 1
    assert checkpoints(ann_thread) == [] and list(Thread.objects.values_list("thread_id", flat=True)) == [bob_thread]
    assert checkpoints(bob_thread)


def test_checkpoints_stay_when_the_delete_rolls_back(two_threads, django_capture_on_commit_callbacks):
    ann_thread, _ = two_threads
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        threads.delete_threads([ann_thread])
    assert callbacks  # deferred to the commit, which never comes here
    assert checkpoints(ann_thread)


def test_deleting_memory_users_deletes_their_threads(service, two_threads, django_capture_on_commit_callbacks):
    ann_thread, bob_thread = two_threads
    ann = MemoryUser.objects.get(canonical_id="chat:ann")
    with django_capture_on_commit_callbacks(execute=True):
        assert service.delete_users([ann.pk], cascade=True).deleted == 1
    assert not MemoryUser.objects.filter(pk=ann.pk).exists()
    assert checkpoints(ann_thread) == [] and checkpoints(bob_thread)
    assert list(Thread.objects.values_list("thread_id", flat=True)) == [bob_thread]


def test_delete_users_with_a_malformed_id_deletes_nothing(service, two_threads):
    ann = MemoryUser.objects.get(canonical_id="chat:ann")
    from memory.exceptions import InvalidMemoryArgument

    with pytest.raises(InvalidMemoryArgument) as caught:
        service.delete_users([ann.pk, "ann"], cascade=True)
    assert caught.value.field == "ids[1]"
    assert MemoryUser.objects.filter(pk=ann.pk).exists() and Thread.objects.count() == 2


def test_a_merged_user_continues_their_thread(service, demo_workflow):
    first = talk(demo_workflow, "ann", "my name is Ann")
    ann = MemoryUser.objects.get(canonical_id="chat:ann")
    mail = talk(demo_workflow, None, "hi", email="ann@example.com")
    target = MemoryUser.objects.get(canonical_id="email:ann@example.com")
    service.merge_users(ann.pk, target.pk)
    again = talk(demo_workflow, "ann", "what is my name?")
    assert "Ann" in again.reply
    assert again.user["id"] == target.pk
    # Both had a direct thread with the demo: the more recently active one (the email one) is kept.
    assert again.thread_id == mail.thread_id and Thread.objects.count() == 1
    assert first.thread_id != mail.thread_id


def test_a_merged_users_only_thread_moves_to_the_survivor(service, demo_workflow):
    first = talk(demo_workflow, "ann", "hello")
    ann = MemoryUser.objects.get(canonical_id="chat:ann")
    target, _ = service.get_or_create_user("email", "ann@example.com")
    service.merge_users(ann.pk, target.pk)
    again = talk(demo_workflow, None, "hello again", email="ann@example.com")
    assert again.thread_id == first.thread_id
    assert Thread.objects.get().user_id == target.pk


def test_retention_keeps_the_most_recent_threads_per_workflow(
    settings, demo_workflow, django_capture_on_commit_callbacks
):
    settings.WORKFLOWS = {**settings.WORKFLOWS, "MAX_THREADS_PER_WORKFLOW": 2}
    with django_capture_on_commit_callbacks(execute=True):
        old = talk(demo_workflow, "u1").thread_id
        talk(demo_workflow, "u2")
        talk(demo_workflow, "u3")
    assert Thread.objects.count() == 2 and not Thread.objects.filter(thread_id=old).exists()
    assert checkpoints(old) == []
