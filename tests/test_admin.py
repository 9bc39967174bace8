"""The /memories/ admin: the tabbed index, the columns, bulk delete behind a confirmation, user pages and merges."""

import re

import pytest
from django.utils import timezone

from memory.admin.tabs import memories_site
from memory.models import ChannelIdentity, Episode, Fact, MemoryUser

pytestmark = pytest.mark.django_db

FACTS = "/memories/memory/fact/"
USERS = "/memories/memory/memoryuser/"


def confirmation_form(html):
    """The hidden fields of a confirmation page's form, as the browser would post them back."""
    data = {}
    for name, value in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', html):
        if name != "csrfmiddlewaretoken":
            data.setdefault(name, []).append(value)
    return data


def tab_links(html):
    return re.findall(r'<a role="tab" id="tab-([a-z-]+)" href="([^"]+)"', html)


def test_index_opens_the_first_tab_and_every_page_shows_the_tabs(staff_client):
    response = staff_client.get("/memories/")
    assert response.status_code == 302 and response["Location"] == FACTS
    html = staff_client.get(FACTS).content.decode()
    tabs = tab_links(html)
    expected = ["facts", "episodes", "procedures", "store", "users", "teams", "promotions", "deletions", "health"]
    if any(label == "checkpoints" for label, _ in tabs):
        expected.insert(2, "checkpoints")
    if any(label == "reminders" for label, _ in tabs):  # the workflows app's, beside memory's own
        expected.insert(expected.index("users"), "reminders")
    assert [label for label, _ in tabs] == expected
    assert 'id="tab-facts" href="/memories/memory/fact/" class="active"' in html


def test_each_tab_keeps_its_own_page_and_filters(staff_client, service):
    for n in range(60):
        service.set_fact(f"note_{n:02}", n)
    assert staff_client.get(FACTS, {"p": "2", "scope__exact": "global"}).status_code == 200
    html = staff_client.get("/memories/memory/episode/", {"success__exact": "1"}).content.decode()
    links = dict(tab_links(html))
    assert links["facts"] == "/memories/memory/fact/?p=2&amp;scope__exact=global"
    assert links["episodes"] == "/memories/memory/episode/?success__exact=1"
    assert links["users"] == USERS
    # ...and the index reopens Facts where the operator left it.
    assert staff_client.get("/memories/")["Location"] == "/memories/memory/fact/?p=2&scope__exact=global"


def test_fact_tab_columns_and_fifty_per_page(staff_client, service, user_factory):
    ann = user_factory("ann")
    service.set_fact(
        "favourite_tea", "oolong", scope="user", user_id=ann.pk, fact_type="user_preference", confidence=0.73
    )
    for n in range(55):
        service.set_fact(f"note_{n:02}", "x" * 100)
    html = staff_client.get(FACTS).content.decode()
    assert '<span class="badge badge-scope badge-scope-user">user</span>' in html
    assert '<span class="badge badge-type badge-type-user_preference">User preference</span>' in html
    assert "73%" in html
    assert "x" * 57 + "..." in html
    assert html.count('class="action-select"') == 50
    assert "56 facts" in html
    assert 'id="delete-selected"' in html and "Delete selected (<span" in html
    for column in ["key", "value", "scope", "type", "confidence", "last accessed", "updated at"]:
        assert f">{column.capitalize()}<" in html or f">{column}<" in html.lower(), column


def test_other_tabs_show_their_columns(staff_client, service, user_factory):
    ann = user_factory("ann", display_name="Ann")
    service.link_identity(ann.pk, "email", "ann@example.org")
    episode = service.start_episode(agent_id="planner", user_id=ann.pk, trigger_type="telegram")
    service.complete_episode(episode.pk, success=True, summary="booked a table")
    proc = service.save_procedure("weather", agent_id="planner", procedure_type="tool_sequence")
    service.record_procedure_use(proc.pk, success=True)
    service.record_procedure_use(proc.pk, success=False)

    # A workflow's episode records its conversation and no summary: the list shows its first message.
    service.record_episode(
        started_at=episode.started_at,
        agent_id="planner",
        success=True,
        conversation=[
            {"role": "user", "content": "is the terrace open tonight?"},
            {"role": "assistant", "content": "Yes"},
        ],
    )
    html = staff_client.get("/memories/memory/episode/").content.decode()
    assert "planner" in html and "telegram" in html and "booked a table" in html and " ms<" in html
    assert "user: is the terrace open tonight?" in html
    html = staff_client.get("/memories/memory/procedure/").content.decode()
    assert "weather" in html and "Tool sequence" in html and "50%" in html
    html = staff_client.get(USERS).content.decode()
    assert "Ann" in html and "test:ann" in html and "email:ann@example.org, test:ann" in html
    assert "ann@example.org</td>" in html


@pytest.mark.parametrize("path", ["memory/fact/", "memory/episode/", "memory/procedure/", "memory/memoryuser/"])
def test_changelist_query_count_does_not_grow_with_rows(
    path, staff_client, service, user_factory, capture_data_queries
):
    def grow(n):
        for _ in range(n):
            user = user_factory()
            service.link_identity(user.pk, "email", f"{user.pk}@example.org")
            service.set_fact("k", user.pk, scope="user", user_id=user.pk)
            service.start_episode(agent_id="a", user_id=user.pk)
            service.save_procedure(f"p{user.pk}")

    grow(2)
    staff_client.get(f"/memories/{path}")
    with capture_data_queries() as small:
        staff_client.get(f"/memories/{path}")
    grow(30)
    with capture_data_queries() as large:
        assert staff_client.get(f"/memories/{path}").status_code == 200
    assert len(large.data) == len(small.data), large.data
    assert len(large.data) <= 10


def test_delete_selected_asks_first_then_deletes(staff_client, service):
    facts = [service.set_fact(f"note_{n}", n).fact for n in range(5)]
    chosen = [str(f.pk) for f in facts[:3]]
    response = staff_client.post(FACTS, {"action": "delete_memories", "index": "0", "_selected_action": chosen})
    assert response.status_code == 200
    html = response.content.decode()
    assert "Delete these 3 facts?" in html and 'value="Yes, delete 3"' in html
    assert Fact.objects.count() == 5  # nothing yet
    assert sorted(confirmation_form(html)["_selected_action"]) == sorted(chosen)
    response = staff_client.post(FACTS, confirmation_form(html))
    assert response.status_code == 302
    assert sorted(Fact.objects.values_list("key", flat=True)) == ["note_3", "note_4"]
    assert "Deleted 3 facts." in staff_client.get(response["Location"]).content.decode()


def test_select_all_across_pages_deletes_every_matching_row(staff_client, service):
    for n in range(120):
        service.set_fact(f"note_{n}", n)
    service.set_fact("office_hours", "9-17", scope="agent", agent_id="support")
    url = FACTS + "?scope__exact=global"
    on_page = [str(pk) for pk in Fact.objects.filter(scope="global").order_by("key")[:50].values_list("pk", flat=True)]
    response = staff_client.post(
        url, {"action": "delete_memories", "index": "0", "select_across": "1", "_selected_action": on_page}
    )
    html = response.content.decode()
    assert "Delete these 120 facts?" in html
    assert Fact.objects.count() == 121
    response = staff_client.post(url, confirmation_form(html))
    assert response.status_code == 302
    assert list(Fact.objects.values_list("key", flat=True)) == ["office_hours"]


def test_deleting_users_shows_what_goes_with_them_and_forgets_them(staff_client, service, user_factory):
    ann = user_factory("ann")
    service.set_fact("favourite_tea", "oolong", scope="user", user_id=ann.pk)
    service.start_episode(user_id=ann.pk)
    data = {"action": "delete_memories", "index": "0", "_selected_action": [str(ann.pk)]}
    html = staff_client.post(USERS, data).content.decode()
    assert "1 facts" in html and "1 episodes" in html and "1 identities" in html
    staff_client.post(USERS, {**data, "post": "yes"})
    assert not MemoryUser.objects.exists() and not Fact.objects.exists() and not Episode.objects.exists()
    assert not ChannelIdentity.objects.exists()


def test_delete_from_a_detail_page_goes_through_the_service(staff_client, service, user_factory):
    ann = user_factory("ann")
    service.set_fact("favourite_tea", "oolong", scope="user", user_id=ann.pk)
    html = staff_client.get(f"{USERS}{ann.pk}/delete/").content.decode()
    assert "Facts: 1" in html
    response = staff_client.post(f"{USERS}{ann.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not MemoryUser.objects.exists() and not Fact.objects.exists()


def test_user_detail_shows_identities_facts_episodes_and_threads(staff_client, service, user_factory):
    ann = user_factory("ann")
    service.link_identity(ann.pk, "email", "ann@example.org")
    service.set_fact("favourite_tea", "oolong", scope="user", user_id=ann.pk)
    episode = service.start_episode(user_id=ann.pk, agent_id="planner")
    html = staff_client.get(f"{USERS}{ann.pk}/change/").content.decode()
    assert "ann@example.org" in html
    assert "Facts (1)" in html and "favourite_tea" in html and f"{FACTS}?user__id__exact={ann.pk}" in html
    assert "Episodes (1)" in html and f"/memories/memory/episode/{episode.pk}/change/" in html
    assert "Threads" in html
    assert f"{USERS}{ann.pk}/merge/" in html
    # The "all facts of this user" link is a working filter.
    service.set_fact("other", 1)
    listed = staff_client.get(FACTS, {"user__id__exact": ann.pk}).content.decode()
    assert "favourite_tea" in listed and ">other<" not in listed


def test_sections_registered_by_other_apps_appear_on_user_pages(staff_client, user_factory):
    from django.utils.html import format_html

    ann = user_factory("ann")
    memories_site.register_user_section(
        "Conversation threads", lambda user: format_html("<p>threads of {}</p>", user.pk)
    )
    try:
        html = staff_client.get(f"{USERS}{ann.pk}/change/").content.decode()
    finally:
        memories_site._user_sections.pop()
    assert "Conversation threads" in html and f"threads of {ann.pk}" in html


def test_merge_selected_users(staff_client, service, user_factory):
    ann, ann2, bob = user_factory("ann"), user_factory("ann-2"), user_factory("bob")
    service.set_fact("tea", "oolong", scope="user", user_id=ann2.pk)
    data = {"action": "merge_users", "index": "0", "_selected_action": [str(ann.pk), str(ann2.pk)]}
    html = staff_client.post(USERS, data).content.decode()
    assert "Merge 2 users" in html and f'value="{ann.pk}"' in html
    response = staff_client.post(USERS, {**data, "post": "yes", "target": str(ann.pk)})
    assert response.status_code == 302
    assert MemoryUser.objects.get(pk=ann2.pk).merged_into_id == ann.pk
    assert Fact.objects.get(key="tea").user_id == ann.pk
    assert MemoryUser.objects.get(pk=bob.pk).merged_into_id is None


def test_merge_from_a_detail_page(staff_client, service, user_factory):
    ann, ann2 = user_factory("ann"), user_factory("ann-2")
    url = f"{USERS}{ann2.pk}/merge/"
    assert staff_client.get(url).status_code == 200
    html = staff_client.post(url, {"target": "abc"}).content.decode()
    assert "target:" in html
    html = staff_client.post(url, {"target": str(ann2.pk)}).content.decode()
    assert "already the same user" in html
    assert MemoryUser.objects.get(pk=ann2.pk).merged_into_id is None
    response = staff_client.post(url, {"target": str(ann.pk)})
    assert response.status_code == 302 and response["Location"] == f"{USERS}{ann.pk}/change/"
    assert MemoryUser.objects.get(pk=ann2.pk).merged_into_id == ann.pk


def test_memories_cannot_be_added_by_hand(staff_client):
    assert staff_client.get(f"{FACTS}add/").status_code == 403


def test_non_staff_cannot_reach_any_tab_or_action(client, django_user_model, service):
    fact = service.set_fact("k", 1).fact
    client.force_login(django_user_model.objects.create_user("visitor"))
    for path in [FACTS, USERS, "/memories/memory/episode/", f"{FACTS}{fact.pk}/change/"]:
        assert client.get(path).status_code == 302
    client.post(FACTS, {"action": "delete_memories", "index": "0", "post": "yes", "_selected_action": [str(fact.pk)]})
    assert Fact.objects.filter(pk=fact.pk).exists()


# ------------------------------------------------------------------ whose memory it is; edits


def test_the_lists_show_whose_memory_each_row_is_in_one_query(
    staff_client, service, user_factory, django_assert_max_num_queries
):
    """Three rows of favourite_colour = blue: the owner column tells the person, the agent, everyone apart."""
    ann = user_factory("ann")
    service.set_fact("favourite_colour", "blue", scope="user", user_id=ann.pk)
    service.set_fact("favourite_colour", "blue", scope="agent", agent_id="support")
    service.set_fact("favourite_colour", "blue", scope="global")
    for n in range(5):  # more people: the column must not cost a query per row
        service.set_fact("favourite_colour", "blue", scope="user", user_id=user_factory(f"u{n}").pk)
    staff_client.get(FACTS)
    with django_assert_max_num_queries(12):
        html = staff_client.get(FACTS).content.decode()
    assert ann.display_name in html and "agent support" in html and "everyone" in html
    episode = service.record_episode(started_at=timezone.now(), agent_id="support", user_id=ann.pk, success=True)
    html = staff_client.get("/memories/memory/episode/").content.decode()
    assert f"{ann.display_name} with agent support" in html
    confirm = staff_client.post(
        FACTS, {"action": "delete_memories", "_selected_action": [f.pk for f in Fact.objects.filter(user=ann)]}
    ).content.decode()
    assert f"favourite_colour (user:{ann.pk}) — {ann.display_name}" in confirm
    assert episode.pk


def test_a_fact_edited_in_the_admin_goes_through_the_service(staff_client, service, user_factory):
    ann = user_factory("ann")
    fact = service.set_fact("city", "Porto", scope="user", user_id=ann.pk).fact
    change = f"{FACTS}{fact.pk}/change/"
    form = {"value": '"Lisbon"', "fact_type": "world_knowledge", "confidence": "0.9"}
    assert staff_client.post(change, {**form, "key": "hijacked"}).status_code == 302
    fact.refresh_from_db()
    assert (fact.key, fact.value, fact.confidence, fact.user_id) == (
        "city",
        "Lisbon",
        0.9,
        ann.pk,
    )  # key and owner stay
    assert fact.provenance == "edited by an operator"
    assert [f.pk for f in service.search_facts("lisbon", user_id=ann.pk)] == [fact.pk]  # the index followed
    bad = staff_client.post(change, {**form, "value": '"a\\ud800b"'})  # a lone surrogate: no database stores it
    assert bad.status_code == 200 and "unpaired surrogate" in bad.content.decode()
    bad = staff_client.post(change, {**form, "confidence": "7"})
    assert bad.status_code == 200 and "from 0 to 1" in bad.content.decode()
    fact.refresh_from_db()
    assert (fact.value, fact.confidence) == ("Lisbon", 0.9)  # nothing changed


def test_a_fact_page_shows_its_history(staff_client, service, django_assert_max_num_queries):
    fact = service.set_fact("city", "Porto", provenance="told by ada").fact
    service.set_fact("city", "Lisbon", provenance="moved")
    html = staff_client.get(f"{FACTS}{fact.pk}/change/").content.decode()
    history = html[html.index('class="fact-history"') :]
    history = history[: history.index("</table>")]
    assert history.index("created") < history.index("updated")
    assert "Porto" in history and "Lisbon" in history and "told by ada" in history and "moved" in history
    # an edit through the page is a version too
    form = {"value": '"Faro"', "confidence": "0.5", "fact_type": "world_knowledge"}
    assert staff_client.post(f"{FACTS}{fact.pk}/change/", form).status_code == 302
    html = staff_client.get(f"{FACTS}{fact.pk}/change/").content.decode()
    assert "Faro" in html[html.index('class="fact-history"') :]
