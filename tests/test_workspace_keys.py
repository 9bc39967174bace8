"""Unique keys per workspace: two tenants pick the same names (an agent's fact key, a global key, a
session id, a Telegram identity, a procedure, a store namespace and key, a team name). Each write
succeeds, each tenant reads its own, and neither sees, shadows or overwrites the other's."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from memory.models import DEFAULT_WORKSPACE_ID, Fact, MemoryUser, Procedure, StoreItem, Team, Workspace, in_workspace
from memory.service import MemoryService
from workflows.store import EngramStore

AGENT, SESSION = "support-bot", "s-1"
OWNERS = {"session": {"session_id": SESSION}, "agent": {"agent_id": AGENT}, "global": {}}


@pytest.fixture
def tenants(db):
    return {"A": Workspace.objects.create(slug="a"), "B": Workspace.objects.create(slug="b")}


def test_two_workspaces_write_and_read_the_same_fact_keys(tenants):
    service = MemoryService()
    for mark, workspace in tenants.items():
        with in_workspace(workspace):
            for scope, owner in OWNERS.items():
                write = service.set_fact("tone", f"{mark} {scope}", scope=scope, **owner)
                assert write.action == "created"
    for mark, workspace in tenants.items():
        with in_workspace(workspace):
            assert service.get_fact("tone").value == f"{mark} global"
            assert service.get_fact("tone", agent_id=AGENT).value == f"{mark} agent"
            assert service.get_fact("tone", agent_id=AGENT, session_id=SESSION).value == f"{mark} session"
            assert [f.value for f in service.search_facts("tone", agent_id=AGENT)] == [f"{mark} agent"]
            assert [f.value for f in service.list_facts(agent_id=AGENT, session_id=SESSION)] == [f"{mark} session"]
    # A second write in A updates A's fact only.
    with in_workspace(tenants["A"]):
        assert service.set_fact("tone", "A agent, later", scope="agent", agent_id=AGENT).action == "updated"
    with in_workspace(tenants["B"]):
        assert service.get_fact("tone", agent_id=AGENT).value == "B agent"
    assert Fact.objects.in_workspace(tenants["B"]).filter(key="tone").count() == 3


def test_a_more_specific_fact_of_another_workspace_never_hides_yours(tenants):
    """A holds the global fact only; B holds the agent's and the session's of the same key. A viewer
    of that agent and session in A gets A's global fact from every read."""
    service = MemoryService()
    with in_workspace(tenants["A"]):
        mine = service.set_fact("greeting", "hello from A", scope="global").fact
    with in_workspace(tenants["B"]):
        theirs = [
            service.set_fact("greeting", f"B {scope}", scope=scope, **owner).fact
            for scope, owner in OWNERS.items()
            if scope != "global"
        ]
    service.pin_memories("fact", [mine.pk, *(f.pk for f in theirs)])
    viewer = {"agent_id": AGENT, "session_id": SESSION}
    with in_workspace(tenants["A"]):
        assert service.get_fact("greeting", **viewer).pk == mine.pk
        assert [f.pk for f in service.search_facts("greeting", **viewer)] == [mine.pk]
        assert [f.pk for f in service.search_facts("greeting", **viewer, limit=1)] == [mine.pk]
        assert [f.pk for f in service.list_facts(**viewer)] == [mine.pk]
        assert [f.pk for f in service.pinned_memories(**viewer)[0]] == [mine.pk]


def test_a_lookup_in_a_workspace_is_still_one_query(tenants):
    service = MemoryService()
    with in_workspace(tenants["A"]):
        service.set_fact("tone", "warm", scope="agent", agent_id=AGENT)
        with CaptureQueriesContext(connection) as queries:
            assert service.get_fact("tone", agent_id=AGENT, session_id=SESSION).value == "warm"
    assert len(queries) == 1
    assert "workspace_id" in queries[0]["sql"]


def test_two_workspaces_know_a_person_by_the_same_telegram_identity(tenants):
    service = MemoryService()
    people = {}
    for mark, workspace in tenants.items():
        with in_workspace(workspace):
            person, created = service.get_or_create_user("telegram", "42", display_name=f"{mark} person")
            assert created
            people[mark] = person
            service.set_fact("city", f"{mark} city", scope="user", user_id=person.pk)
    assert people["A"].pk != people["B"].pk
    assert people["A"].canonical_id == people["B"].canonical_id == "telegram:42"
    for mark, workspace in tenants.items():
        with in_workspace(workspace):
            assert service.find_user("telegram", "42").pk == people[mark].pk
            assert service.get_or_create_user("telegram", "42") == (people[mark], False)
            context = service.identify("telegram", "42").context
            assert (context.user_id, context.display_name) == (people[mark].pk, f"{mark} person")
            assert [f["value"] for f in context.facts] == [f"{mark} city"]
            assert list(MemoryUser.objects.values_list("pk", flat=True)) == [people[mark].pk]


def test_a_person_identified_first_in_a_workspace_is_created_there(tenants):
    """identify (every workflow run's first step) of an identity another workspace knows: a new person."""
    service = MemoryService()
    with in_workspace(tenants["A"]):
        first = service.identify("telegram", "42").context
    with in_workspace(tenants["B"]):
        again = service.identify("telegram", "42")
    assert again.created and again.context.user_id != first.user_id


def test_two_workspaces_keep_procedures_of_the_same_agent_and_name(tenants):
    service = MemoryService()
    procedures = {}
    for mark, workspace in tenants.items():
        with in_workspace(workspace):
            procedures[mark] = service.save_procedure(
                "refund", agent_id=AGENT, description=f"{mark} steps", trigger_conditions={"goal_contains": ["refund"]}
            )
    assert procedures["A"].pk != procedures["B"].pk
    service.pin_memories("procedure", [p.pk for p in procedures.values()])
    for mark, workspace in tenants.items():
        with in_workspace(workspace):
            assert service.get_procedure("refund", agent_id=AGENT).description == f"{mark} steps"
            assert service.find_procedure("a refund please", agent_id=AGENT).pk == procedures[mark].pk
            assert [p.pk for p in service.pinned_memories(agent_id=AGENT)[1]] == [procedures[mark].pk]
    with in_workspace(tenants["A"]):
        service.save_procedure("refund", agent_id=AGENT, description="A steps, revised")
    assert Procedure.objects.get(pk=procedures["B"].pk).description == "B steps"


def test_two_workspaces_keep_store_items_of_the_same_namespace_and_key(tenants):
    store = EngramStore()
    for mark, workspace in tenants.items():
        with in_workspace(workspace):
            store.put(("docs", "shared"), "note", {"text": f"{mark} note"})
    with in_workspace(tenants["A"]):
        store.put(("docs", "shared"), "note", {"text": "A note, later"})
    for mark, workspace in tenants.items():
        with in_workspace(workspace):
            expected = "A note, later" if mark == "A" else "B note"
            assert store.get(("docs", "shared"), "note").value == {"text": expected}
            assert [item.value["text"] for item in store.search(("docs",))] == [expected]
    assert StoreItem.objects.in_workspace(tenants["B"]).get().value == {"text": "B note"}


def test_two_workspaces_keep_teams_of_the_same_name(tenants):
    service = MemoryService()
    teams = {}
    for mark, workspace in tenants.items():
        with in_workspace(workspace):
            teams[mark] = service.create_team("ops", agent_ids=[AGENT])
            service.set_fact("rota", f"{mark} rota", scope="team", team="ops")
    assert teams["A"].pk != teams["B"].pk
    for mark, workspace in tenants.items():
        with in_workspace(workspace):
            assert service.get_team("ops").pk == teams[mark].pk
            assert service.get_fact("rota", agent_id=AGENT).value == f"{mark} rota"
            with pytest.raises(Exception, match="exists already"):
                service.create_team("ops")
    assert Team.objects.in_workspace(tenants["A"]).count() == 1


def test_unscoped_code_writes_and_reads_the_default_workspace(tenants):
    """Code outside any workspace (commands, workers) writes into the default workspace, beside A's
    fact of the same key, and reads back what it wrote."""
    service = MemoryService()
    with in_workspace(tenants["A"]):
        service.set_fact("tone", "A agent", scope="agent", agent_id=AGENT)
    write = service.set_fact("tone", "default agent", scope="agent", agent_id=AGENT)
    assert write.action == "created" and write.fact.workspace_id == DEFAULT_WORKSPACE_ID
    assert service.set_fact("tone", "default agent, later", scope="agent", agent_id=AGENT).action == "updated"
    for workspace in (None, *tenants.values()):
        with in_workspace(workspace):
            service.save_procedure("refund", agent_id=AGENT, description=f"{workspace} steps")
    assert service.save_procedure("refund", agent_id=AGENT, description="again").workspace_id == DEFAULT_WORKSPACE_ID
    assert Procedure.objects.filter(name="refund").count() == 3
    person, created = service.get_or_create_user("telegram", "7")
    assert created and service.find_user("telegram", "7").pk == person.pk
    with in_workspace(tenants["A"]):
        assert service.get_fact("tone", agent_id=AGENT).value == "A agent"
    with in_workspace(DEFAULT_WORKSPACE_ID):
        assert service.get_fact("tone", agent_id=AGENT).value == "default agent, later"


def test_the_admin_refuses_a_team_name_taken_in_its_workspace_only(tenants, client, django_user_model):
    from django.urls import reverse

    from memory.models import WorkspaceMember

    operator = django_user_model.objects.create_user("operator-a", is_staff=True, is_superuser=True)
    WorkspaceMember.objects.create(user=operator, workspace=tenants["A"])
    client.force_login(operator)
    with in_workspace(tenants["B"]):
        MemoryService().create_team("ops")
    url = reverse("memories:memory_team_add")
    form = {"name": "ops", "description": "", "members-TOTAL_FORMS": 0, "members-INITIAL_FORMS": 0}
    assert client.post(url, form).status_code == 302  # B's team of that name is no obstacle
    response = client.post(url, form)
    assert response.status_code == 200 and "already exists" in response.content.decode()
    assert Team.objects.in_workspace(tenants["A"]).count() == 1
