"""The Checkpoints tab of /memories/: threads with their newest checkpoint, a thread's checkpoints, deletes."""

import re

import pytest
from django.utils import timezone

from memory.models import MemoryUser
from tests.workflow_helpers import saved
from workflows.models import Thread

pytestmark = pytest.mark.django_db

CHECKPOINTS = "/memories/workflows/thread/"


def confirmation_form(html):
    data = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', html):
        if name != "csrfmiddlewaretoken":
            data.setdefault(name, []).append(value)
    return data


def test_the_tab_sits_between_episodes_and_procedures(staff_client):
    html = staff_client.get("/memories/memory/fact/").content.decode()
    assert re.findall(r'<a role="tab" id="tab-([a-z-]+)"', html) == [
        "facts",
        "episodes",
        "checkpoints",
        "procedures",
        "store",
        "reminders",
        "users",
        "teams",
        "promotions",
        "deletions",
        "health",
    ]
    html = staff_client.get(CHECKPOINTS).content.decode()
    assert f'id="tab-checkpoints" href="{CHECKPOINTS}" class="active"' in html


def test_each_thread_row_shows_its_newest_checkpoint(staff_client, threads):
    head, parent = saved(threads["ann"])[:2]
    html = staff_client.get(CHECKPOINTS).content.decode()
    for column in ["thread id", "checkpoint id", "parent", "step", "source", "blob size", "checkpoint count", "user"]:
        assert f">{column.capitalize()}<" in html or f">{column}<" in html.lower(), column
    row = re.search(rf"<tr>.*?{re.escape(threads['ann'])}.*?</tr>", html, re.S).group(0)
    assert head.config["configurable"]["checkpoint_id"] in row
    assert parent.config["configurable"]["checkpoint_id"] in row
    assert f'<td class="field-head_step">{head.metadata["step"]}</td>' in row
    assert f">{head.metadata['source']}</span>" in row
    assert re.search(r'field-head_blob_size">[\d.]+ (B|KB)<', row)
    assert "Delete selected (<span" in html


def test_search_and_user_links_narrow_the_tab(staff_client, threads):
    html = staff_client.get(CHECKPOINTS, {"q": threads["bob"]}).content.decode()
    assert threads["bob"] in html and threads["ann"] not in html
    ann = MemoryUser.objects.get(canonical_id="chat:ann")
    html = staff_client.get(CHECKPOINTS, {"user__id__exact": ann.pk}).content.decode()
    assert threads["ann"] in html and threads["bob"] not in html
    html = staff_client.get(CHECKPOINTS, {"thread_id": threads["ann"]}).content.decode()
    assert threads["ann"] in html and threads["bob"] not in html


def test_fifty_threads_per_page_and_queries_do_not_grow(staff_client, demo_workflow, capture_data_queries):
    def grow(start, n):
        now = timezone.now()
        for i in range(start, start + n):
            user = MemoryUser.objects.create(canonical_id=f"test:{i}", display_name=f"User {i}")
            Thread.objects.create(
                thread_id=f"{user.pk}:direct:{demo_workflow.pk}", workflow=demo_workflow, user=user, last_activity=now
            )

    grow(0, 3)
    staff_client.get(CHECKPOINTS)
    with capture_data_queries() as small:
        staff_client.get(CHECKPOINTS)
    grow(3, 60)
    with capture_data_queries() as large:
        html = staff_client.get(CHECKPOINTS).content.decode()
    assert len(large.data) == len(small.data) <= 10, large.data
    assert html.count('class="action-select"') == 50 and "63 threads" in html


def test_a_thread_page_lists_its_checkpoints_a_page_at_a_time(staff_client, threads, monkeypatch):
    thread = Thread.objects.get(thread_id=threads["ann"])
    in_saver = [c.config["configurable"]["checkpoint_id"] for c in saved(thread.thread_id)]
    html = staff_client.get(f"{CHECKPOINTS}{thread.pk}/change/").content.decode()
    listed = re.findall(r"<tr><td>[^<]+</td><td>([0-9a-f-]{36})</td>", html)
    assert listed == in_saver
    assert "Older checkpoints" not in html and 'name="_save"' not in html  # read-only

    import workflows.admin

    monkeypatch.setattr(workflows.admin, "CHECKPOINTS_PER_PAGE", 3)
    html = staff_client.get(f"{CHECKPOINTS}{thread.pk}/change/").content.decode()
    assert re.findall(r"<tr><td>[^<]+</td><td>([0-9a-f-]{36})</td>", html) == in_saver[:3]
    older = re.search(r'href="\?before=([0-9a-f-]+)" id="checkpoints-older"', html).group(1)
    html = staff_client.get(f"{CHECKPOINTS}{thread.pk}/change/", {"before": older}).content.decode()
    assert re.findall(r"<tr><td>[^<]+</td><td>([0-9a-f-]{36})</td>", html) == in_saver[3:6]
    html = staff_client.get(f"{CHECKPOINTS}{thread.pk}/change/", {"before": "nonsense!"}).content.decode()
    assert "Before: not a checkpoint id" in html


def test_delete_selected_threads_asks_first_then_deletes_their_checkpoints(
    staff_client, threads, django_capture_on_commit_callbacks
):
    ann = Thread.objects.get(thread_id=threads["ann"])
    data = {"action": "delete_memories", "index": "0", "_selected_action": [str(ann.pk)]}
    html = staff_client.post(CHECKPOINTS, data).content.decode()
    assert "Delete these 1 threads?" in html and f"{ann.checkpoint_count} checkpoints and their pending writes" in html
    assert saved(ann.thread_id)  # nothing yet
    with django_capture_on_commit_callbacks(execute=True):
        response = staff_client.post(CHECKPOINTS, confirmation_form(html))
    assert response.status_code == 302
    assert saved(ann.thread_id) == [] and saved(threads["bob"])
    assert list(Thread.objects.values_list("thread_id", flat=True)) == [threads["bob"]]
    assert "Deleted 1 thread." in staff_client.get(response["Location"]).content.decode()


def test_delete_from_a_thread_page(staff_client, threads, django_capture_on_commit_callbacks):
    bob = Thread.objects.get(thread_id=threads["bob"])
    html = staff_client.get(f"{CHECKPOINTS}{bob.pk}/delete/").content.decode()
    assert f"Checkpoints and their pending writes: {bob.checkpoint_count}" in html
    with django_capture_on_commit_callbacks(execute=True):
        assert staff_client.post(f"{CHECKPOINTS}{bob.pk}/delete/", {"post": "yes"}).status_code == 302
    assert saved(bob.thread_id) == [] and not Thread.objects.filter(pk=bob.pk).exists()


def test_a_users_page_lists_their_threads(staff_client, threads):
    ann = MemoryUser.objects.get(canonical_id="chat:ann")
    thread = Thread.objects.get(thread_id=threads["ann"])
    html = staff_client.get(f"/memories/memory/memoryuser/{ann.pk}/change/").content.decode()
    assert "<h3>Threads</h3>" in html and f"{CHECKPOINTS}{thread.pk}/change/" in html
    assert f"{CHECKPOINTS}?user__id__exact={ann.pk}" in html and threads["bob"] not in html


def test_non_staff_cannot_reach_the_tab_or_delete(client, django_user_model, threads):
    client.force_login(django_user_model.objects.create_user("visitor"))
    thread = Thread.objects.get(thread_id=threads["ann"])
    assert client.get(CHECKPOINTS).status_code == 302
    assert client.get(f"{CHECKPOINTS}{thread.pk}/change/").status_code == 302
    client.post(
        CHECKPOINTS, {"action": "delete_memories", "index": "0", "post": "yes", "_selected_action": [str(thread.pk)]}
    )
    assert Thread.objects.filter(pk=thread.pk).exists() and saved(thread.thread_id)
