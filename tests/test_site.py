"""The site: the root redirect and the /memories/ admin where staff browse what agents remember."""

import logging

import pytest

from memory.models import Fact

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "root@example.org", None)  # force_login: no password
    assert admin.is_staff
    client.force_login(admin)
    return client


def test_root_sends_visitors_to_the_login_then_the_builder(client, db):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/memories/login/?next=/builder/"


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


@pytest.mark.django_db
def test_an_unhandled_exception_is_logged_with_its_traceback_and_counted(admin_client, caplog):
    """A real failure (the facts table gone, inside a savepoint undone afterwards) answers a JSON 500,
    its traceback and path reach the server's log, and /healthz counts it."""
    from django.db import connection, transaction

    before = admin_client.get("/healthz").json()["unhandled_errors"]
    admin_client.raise_request_exception = False
    with caplog.at_level(logging.ERROR, logger="django.request"):
        with transaction.atomic():
            with connection.cursor() as cursor:
                # CASCADE on PostgreSQL: the memory graph's foreign keys point at the documents.
                cursor.execute(
                    "DROP TABLE memory_recall_doc" + (" CASCADE" if connection.vendor == "postgresql" else "")
                )
            response = admin_client.get("/api/v1/recall/", {"q": "anything"})
            transaction.set_rollback(True)
    assert response.status_code == 500 and response.json()["detail"].startswith("Server error")
    [record] = [r for r in caplog.records if r.name == "django.request"]
    assert record.exc_info is not None and "/api/v1/recall/" in record.getMessage()
    assert admin_client.get("/healthz").json()["unhandled_errors"] == before + 1


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_a_sqlite_database_without_immediate_transactions_is_refused(settings):
    """The upserts rely on IMMEDIATE write transactions; `manage.py check` says so, naming the database."""
    from django.core.checks import run_checks

    assert not [e for e in run_checks() if e.id == "memory.E001"]
    settings.DATABASES = {**settings.DATABASES, "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.db"}}
    errors = [e for e in run_checks() if e.id == "memory.E001"]
    assert len(errors) == 1 and "DATABASES['other']" in errors[0].msg


def test_sqlite_checkpoints_go_under_base_dir_unless_a_path_is_set_and_the_check_says_when_neither_is(
    settings, tmp_path
):
    """A host project need not set WORKFLOWS['CHECKPOINT_PATH']: its BASE_DIR gives data/checkpoints.db;
    settings with neither fail `manage.py check` naming the setting, not the first conversation."""
    from django.core.checks import run_checks

    from workflows.conversations.checkpointer import checkpoint_path

    settings.WORKFLOWS = {**settings.WORKFLOWS, "CHECKPOINTER": "sqlite", "CHECKPOINT_PATH": None}
    settings.BASE_DIR = tmp_path
    assert checkpoint_path() == tmp_path / "data" / "checkpoints.db"
    assert not [e for e in run_checks() if e.id == "workflows.E002"]
    del settings.BASE_DIR
    [error] = [e for e in run_checks() if e.id == "workflows.E002"]
    assert "WORKFLOWS['CHECKPOINT_PATH']" in error.msg
    settings.WORKFLOWS = {**settings.WORKFLOWS, "CHECKPOINT_PATH": tmp_path / "elsewhere.db"}
    assert checkpoint_path() == tmp_path / "elsewhere.db"
    assert not [e for e in run_checks() if e.id == "workflows.E002"]
