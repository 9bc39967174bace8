"""The site: the root redirect and the /memories/ admin where staff browse what agents remember."""
import pytest

from memory.models import Fact

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.org", None)  # force_login: no password
    assert admin.is_staff
    client.force_login(admin)
    return client


def test_root_redirects_to_memories(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/memories/"


def test_memories_needs_a_login(client):
    response = client.get("/memories/")
    assert response.status_code == 302
    assert response["Location"] == "/memories/login/?next=/memories/"
    response = client.get("/memories/memory/fact/")
    assert response.status_code == 302
    assert response["Location"].startswith("/memories/login/")


def test_a_non_staff_user_is_sent_to_the_login(client, django_user_model):
    user = django_user_model.objects.create_user("visitor")
    client.force_login(user)
    response = client.get("/memories/")
    assert response.status_code == 302
    assert response["Location"] == "/memories/login/?next=/memories/"


def test_staff_see_the_index(staff_client):
    response = staff_client.get("/memories/", follow=True)  # the index opens its first tab, Facts
    assert response.status_code == 200
    content = response.content.decode()
    assert "Engram memories" in content
    assert "/memories/memory/fact/" in content


def test_staff_see_facts_in_the_changelist(staff_client, service, user_factory):
    user = user_factory()
    service.set_fact("favourite_tea_blend", "oolong", scope="user", user_id=user.pk)
    service.set_fact("office_city", "x" * 100)
    response = staff_client.get("/memories/memory/fact/")
    assert response.status_code == 200
    content = response.content.decode()
    assert "favourite_tea_blend" in content
    assert "office_city" in content
    assert "x" * 57 + "..." in content  # long values are shortened
    response = staff_client.get("/memories/memory/fact/", {"q": "oolong"})
    assert response.status_code == 200
    assert "favourite_tea_blend" in response.content.decode()
    assert "office_city" not in response.content.decode()


@pytest.mark.parametrize("path", ["memory/episode/", "memory/procedure/", "memory/memoryuser/"])
def test_staff_see_the_other_changelists(staff_client, service, user_factory, path):
    user_factory("ann")
    service.start_episode(agent_id="planner")
    service.save_procedure("weather_report")
    response = staff_client.get(f"/memories/{path}")
    assert response.status_code == 200


def test_staff_see_a_fact_change_page(staff_client, service):
    fact = service.set_fact("favourite_tea_blend", "oolong").fact
    response = staff_client.get(f"/memories/memory/fact/{fact.pk}/change/")
    assert response.status_code == 200
    assert "favourite_tea_blend" in response.content.decode()


def test_staff_can_delete_a_fact_and_search_forgets_it(staff_client, service):
    fact = service.set_fact("favourite_tea_blend", "oolong").fact
    response = staff_client.post(f"/memories/memory/fact/{fact.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not Fact.objects.filter(pk=fact.pk).exists()
    assert service.search_facts("oolong") == []


def test_a_value_corrected_in_the_admin_is_what_search_finds(staff_client, service):
    """Staff fix a wrong memory in the admin; agents' searches must see the corrected value."""
    fact = service.set_fact("favourite_tea_blend", "oolong").fact
    data = {
        "key": "favourite_tea_blend",
        "value": '"earl grey"',
        "fact_type": "world_knowledge",
        "scope": "global",
        "agent_id": "",
        "user": "",
        "session_id": "",
        "confidence": "0.8",
        "times_confirmed": "0",
        "times_contradicted": "0",
        "source_episode": "",
        "provenance": "",
        "access_count": "0",
        "last_accessed_0": "",
        "last_accessed_1": "",
        "_save": "Save",
    }
    response = staff_client.post(f"/memories/memory/fact/{fact.pk}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Fact.objects.get(pk=fact.pk).value == "earl grey"
    assert service.get_fact("favourite_tea_blend").value == "earl grey"
    assert [f.pk for f in service.search_facts("earl grey")] == [fact.pk]
    assert service.search_facts("oolong") == []
