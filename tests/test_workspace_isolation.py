"""Workspaces keep tenants apart: as workspace A, nothing of workspace B is listed, found, recalled,
changed or deleted, on every REST endpoint of the OpenAPI schema, the /memories/ admin, the LangGraph
store, the service and MCP.

Both workspaces use the same agent id and session id (tenants pick the same names), so a lookup by
owner is tested where the owners' keys are the same text. Every text of B's rows carries MARK_B.
"""

import datetime
import io
import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from memory.exceptions import ImportRejected, InvalidMemoryArgument, MemoryNotFound
from memory.models import (
    DEFAULT_WORKSPACE_ID,
    Episode,
    Fact,
    FactHistory,
    MemoryUser,
    Procedure,
    Promotion,
    StoreItem,
    Workspace,
    WorkspaceMember,
    in_workspace,
)
from memory.service import MemoryService
from tests.workflow_helpers import talk
from workflows.conversations.reminders import schedule_reminder
from workflows.demo import DEMO_DEFINITION
from workflows.models import Reminder, Thread, Workflow, WorkflowRun
from workflows.store import EngramStore

MARK_A, MARK_B = "aardvark", "zebrafish"
AGENT, SESSION = "support-bot", "s-1"


def fill(workspace, mark):
    """One of everything in `workspace`, each text holding `mark`; {kind: [ids]}."""
    service = MemoryService()
    with in_workspace(workspace):
        person, _ = service.get_or_create_user("telegram", f"{mark}-person", display_name=f"{mark} person")
        facts = [
            service.set_fact(f"{mark} colour", f"{mark} blue", scope="user", user_id=person.pk),
            service.set_fact(f"{mark} rule", f"{mark} answer politely", scope="agent", agent_id=AGENT),
            service.set_fact(f"{mark} motto", f"{mark} for everyone", scope="global"),
            service.set_fact(f"{mark} topic", f"{mark} this session", scope="session", session_id=SESSION),
        ]
        service.set_fact(f"{mark} colour", f"{mark} green", scope="user", user_id=person.pk)  # a version
        episode = service.record_episode(
            started_at=timezone.now(),
            agent_id=AGENT,
            user_id=person.pk,
            conversation=[{"role": "user", "content": f"{mark} asked about parcels"}],
            success=True,
            summary=f"{mark} asked about parcels",
        )
        team = service.create_team(f"{mark} crew", agent_ids=[AGENT])
        facts.append(
            service.set_fact(f"{mark} crew rule", f"{mark} share the queue", scope="team", team=team.pk, agent_id=AGENT)
        )
        procedure = service.save_procedure(f"{mark} refund steps", agent_id=AGENT, description=f"{mark} refunds")
        store = EngramStore()
        store.put(("docs", mark), "note", {"text": f"{mark} stored note"})
        store.put(("agents", AGENT), f"{mark}-prefs", {"text": f"{mark} agent prefs"})
        workflow = Workflow.objects.create(slug=f"{mark}-flow", name=f"{mark} flow", definition=DEMO_DEFINITION)
        run = talk(workflow, f"{mark}-chatter", f"{mark} hello there")
        reminder = schedule_reminder(
            user_id=person.pk, when=timezone.now() + datetime.timedelta(days=1), message=f"{mark} call back"
        )
    return {
        "person": person,
        "facts": [w.fact.pk for w in facts],
        "episodes": [episode.pk, run.episode_id],
        "procedures": [procedure.pk],
        "teams": [team.pk],
        "memory-users": [person.pk, run.user["id"]],
        "store-items": list(StoreItem.objects.in_workspace(workspace).values_list("pk", flat=True)),
        "workflows": [workflow.slug],
        "checkpoints": [run.thread_id],
        "runs": [run.run_id],
        "reminders": [reminder.pk],
        "fact-versions": list(
            FactHistory.objects.filter(fact_id__in=[w.fact.pk for w in facts]).values_list("pk", flat=True)
        ),
        "promotions": list(Promotion.objects.filter(user=person).values_list("pk", flat=True)),
    }


@pytest.fixture
def tenants(db, settings):
    a = Workspace.objects.create(slug="a", name="A")
    b = Workspace.objects.create(slug="b", name="B")
    return {"a": a, "b": b, "rows_a": fill(a, MARK_A), "rows_b": fill(b, MARK_B)}


@pytest.fixture
def operator_a(tenants, django_user_model):
    user = django_user_model.objects.create_user("operator-a", is_staff=True)
    WorkspaceMember.objects.create(user=user, workspace=tenants["a"])
    return user


@pytest.fixture
def api_a(operator_a):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=operator_a).key}")
    return client


def schema_paths():
    """{path: [methods]} of every REST endpoint, from the OpenAPI schema (new endpoints join by themselves)."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return {
        path: [m for m in ops if m in ("get", "post", "put", "patch", "delete")]
        for path, ops in schema["paths"].items()
    }


def _resource(path):
    """'/api/v1/facts/{id}/pin/' -> 'facts'."""
    return path.removeprefix("/api/v1/").split("/")[0]


# What a GET of each list endpoint needs besides nothing (the viewer of a lookup or recall).
LIST_QUERIES = {
    "/api/v1/facts/lookup/": {"key": f"{MARK_B} rule", "agent_id": AGENT, "session_id": SESSION},
    "/api/v1/facts/search/": {"q": MARK_B, "agent_id": AGENT, "session_id": SESSION},
    "/api/v1/recall/": {"q": f"{MARK_B} parcels rule motto topic", "agent_id": AGENT, "session_id": SESSION},
}


def test_every_list_endpoint_shows_a_nothing_of_b(api_a, tenants):
    """Every GET without a path parameter, as A: B's mark appears nowhere, A's rows do (so the check can fail)."""
    seen_a = 0
    for path, methods in schema_paths().items():
        if "get" not in methods or "{" in path:
            continue
        query = LIST_QUERIES.get(path, {})
        response = api_a.get(path, query)
        assert response.status_code == 200, (path, response.status_code, response.content[:300])
        body = response.content.decode()
        for asked in query.values():  # an answer may repeat what was asked
            body = body.replace(json.dumps(asked)[1:-1], "")
        assert MARK_B not in body, path
        seen_a += MARK_A in body
    assert seen_a >= 10


# What A asks of the same endpoints to find its own rows.
MINE = {
    "/api/v1/facts/lookup/": {"key": f"{MARK_A} rule"},
    "/api/v1/facts/search/": {"q": MARK_A},
    "/api/v1/recall/": {"q": f"{MARK_A} rule motto"},
}


@pytest.mark.parametrize("when", ["valid_at", "as_of"])
def test_point_in_time_reads_as_a_show_nothing_of_b(api_a, tenants, when):
    """The lookup, search and recall endpoints at a time (fact history, whose versions of B share
    A's agent, session and global owners): B's mark nowhere, A's versions found."""
    now = timezone.now().isoformat()
    for path, query in LIST_QUERIES.items():
        response = api_a.get(path, {**query, when: now})
        assert response.status_code == 200, (path, response.content[:300])
        assert MARK_B not in response.content.decode().replace(query.get("key", query.get("q")), ""), path
        mine = {**query, **MINE[path]}
        assert MARK_A in api_a.get(path, {**mine, when: now}).content.decode(), path


@pytest.mark.parametrize("kind", ["facts", "episodes", "procedures", "memory-users", "store-items", "runs"])
def test_lists_hold_a_rows_only(api_a, tenants, kind):
    path = f"/api/v1/{kind}/"
    ids = {row["id"] for row in api_a.get(path, {"page_size": 200}).json()["results"]}
    assert ids and not ids & set(tenants["rows_b"][kind])
    assert set(tenants["rows_a"][kind]) <= ids


def test_every_endpoint_with_an_id_of_b_answers_404_and_changes_nothing(api_a, tenants):
    """Every method of every path with a path parameter, given one of B's ids: 404, and B's rows stay."""
    rows_b = tenants["rows_b"]
    before = _counts(tenants["b"])
    tried = 0
    for path, methods in schema_paths().items():
        if "{" not in path:
            continue
        resource = _resource(path)
        assert resource in rows_b, f"{path}: the test has no row of B for this endpoint"
        for ident in rows_b[resource]:
            url = path.replace("{id}", str(ident)).replace("{slug}", str(ident)).replace("{thread_id}", str(ident))
            for method in methods:
                if method in ("get", "delete"):
                    response = getattr(api_a, method)(url)
                else:
                    body = {"pinned": True, "rating": 1, "feedback": "x", "trigger": {"type": "chat", "payload": {}}}
                    response = getattr(api_a, method)(url, body, format="json")
                assert response.status_code == 404, (method, url, response.status_code, response.content[:300])
                tried += 1
    assert tried >= 25
    assert _counts(tenants["b"]) == before


def test_batch_deletes_report_b_ids_as_not_found(api_a, tenants):
    rows_b = tenants["rows_b"]
    before = _counts(tenants["b"])
    for path in schema_paths():
        if not path.endswith("/batch-delete/"):
            continue
        resource = _resource(path)
        ids = rows_b[resource]
        body = {"ids": ids, "cascade": True} if resource == "memory-users" else {"ids": ids}
        response = api_a.post(path, body, format="json")
        assert response.status_code in (200, 400, 404), (path, response.content[:300])
        if response.status_code == 200:
            assert response.json()["deleted"] in (0, []), (path, response.json())
    cancel = api_a.post("/api/v1/reminders/cancel/", {"ids": rows_b["reminders"]}, format="json")
    assert cancel.status_code in (200, 400, 404)
    assert _counts(tenants["b"]) == before
    with in_workspace(tenants["a"]):  # in_workspace(B) reads B's rows whatever workspace is current
        assert _counts(tenants["b"]) == before
    assert Reminder.objects.get(pk=rows_b["reminders"][0]).status == "pending"


def test_writes_as_a_cannot_reach_b(api_a, tenants):
    person_b = tenants["rows_b"]["person"]
    response = api_a.post(
        "/api/v1/facts/", {"key": "k", "value": "v", "scope": "user", "user_id": person_b.pk}, format="json"
    )
    assert response.status_code in (400, 404)
    with in_workspace(tenants["b"]):
        assert not Fact.objects.filter(key="k").exists()
    assert not Fact.objects.filter(key="k").exists()


def _counts(workspace):
    return {
        model.__name__: model.objects.in_workspace(workspace).count()
        for model in (Fact, Episode, Procedure, MemoryUser, StoreItem, Workflow, Thread)
    } | {
        "runs": WorkflowRun.objects.in_workspace(workspace).count(),
        "reminders": Reminder.objects.in_workspace(workspace).count(),
    }


def test_admin_changelists_show_a_only(client, operator_a, tenants):
    client.force_login(operator_a)
    from memory.admin.site import memories_site

    shown = 0
    for model in memories_site._registry:
        url = reverse(f"memories:{model._meta.app_label}_{model._meta.model_name}_changelist")
        response = client.get(url)
        if response.status_code == 403:  # a tab this operator has no permission for
            continue
        assert response.status_code == 200, url
        body = response.content.decode()
        assert MARK_B not in body, url
        shown += MARK_A in body
    assert shown >= 4
    person_b = tenants["rows_b"]["person"]
    assert client.get(reverse("memories:memory_memoryuser_change", args=[person_b.pk])).status_code in (302, 404)


def test_store_as_a_sees_nothing_of_b(tenants):
    store = EngramStore()
    with in_workspace(tenants["a"]):
        assert store.get(("docs", MARK_B), "note") is None
        assert store.get(("agents", AGENT), f"{MARK_A}-prefs").value == {"text": f"{MARK_A} agent prefs"}
        assert store.get(("agents", AGENT), f"{MARK_B}-prefs") is None
        found = store.search((), query=MARK_B, limit=50) + store.search(("agents",), limit=50)
        assert found and all(MARK_B not in json.dumps(item.value) for item in found)
        namespaces = store.list_namespaces()
        assert ("docs", MARK_A) in namespaces and ("docs", MARK_B) not in namespaces
        # A put under B's (namespace, key) makes A's own item and never overwrites B's.
        store.put(("docs", MARK_B), "note", {"text": "A's own note"})
        assert store.get(("docs", MARK_B), "note").value == {"text": "A's own note"}
    with in_workspace(tenants["b"]):
        assert store.get(("docs", MARK_B), "note").value == {"text": f"{MARK_B} stored note"}


def test_service_reads_as_a_see_nothing_of_b(tenants):
    service = MemoryService()
    person_b = tenants["rows_b"]["person"]
    with in_workspace(tenants["a"]):
        assert service.get_fact(f"{MARK_B} rule", agent_id=AGENT) is None
        assert service.get_fact(f"{MARK_B} motto") is None
        assert service.get_fact(f"{MARK_A} rule", agent_id=AGENT).value == f"{MARK_A} answer politely"
        for viewer in ({"agent_id": AGENT, "session_id": SESSION}, {}):
            found = service.search_facts(MARK_B, **viewer)
            assert all(MARK_B not in json.dumps(f.value) for f in found)
            hits = service.recall(f"{MARK_B} parcels rule motto topic refund", **viewer).hits
            assert hits == [] or all(MARK_B not in h.text for h in hits)
        assert service.recall(f"{MARK_A} parcels rule motto", agent_id=AGENT).hits  # A's are found
        with pytest.raises(MemoryNotFound):
            service.recall("parcels", user_id=person_b.pk)
        with pytest.raises(InvalidMemoryArgument):
            service.set_fact("k", "v", scope="user", user_id=person_b.pk)
        # B's person is not A's to find: the same identity in A is a person of A's own.
        assert service.find_user("telegram", f"{MARK_B}-person") is None
        own, created = service.get_or_create_user("telegram", f"{MARK_B}-person")
        assert created and own.pk != person_b.pk
        assert service.identify("telegram", f"{MARK_B}-person").context.user_id == own.pk


@pytest.mark.django_db(transaction=True)  # the tools run on worker threads, with connections of their own
def test_mcp_tools_as_a_see_nothing_of_b(tenants):
    import asyncio

    from mcp.server.mcpserver.exceptions import ToolError

    from memory.mcp_server import Caller, build_server

    server = build_server(lambda: Caller(agent_id=AGENT, workspace_id=tenants["a"].pk))

    async def call(name, arguments):
        result = await server.call_tool(name, arguments)
        return json.dumps(result, default=str)

    recalled = asyncio.run(call("recall", {"query": f"{MARK_B} parcels rule motto", "limit": 50}))
    assert MARK_B not in recalled
    now = timezone.now().isoformat()
    for when in ("as_of", "valid_at"):  # through the fact history
        recalled = asyncio.run(call("recall", {"query": f"{MARK_B} {MARK_A} rule motto", "limit": 50, when: now}))
        assert MARK_B not in recalled.replace(f"{MARK_B} {MARK_A}", "") and MARK_A in recalled
    assert MARK_A in asyncio.run(call("recall", {"query": f"{MARK_A} rule", "limit": 50}))
    fact_b = tenants["rows_b"]["facts"][1]  # B's fact of the same agent id
    with pytest.raises(ToolError, match="no fact"):
        asyncio.run(call("forget", {"kind": "fact", "id": fact_b}))
    assert Fact.objects.filter(pk=fact_b).exists()


def test_default_workspace_holds_rows_made_outside_any_workspace(db):
    service = MemoryService()
    person, _ = service.get_or_create_user("test", "nobody-in-particular")
    assert person.workspace_id == DEFAULT_WORKSPACE_ID
    assert Workspace.objects.get(pk=DEFAULT_WORKSPACE_ID).slug == "default"


def test_export_holds_the_workspace_only_and_import_lands_in_it(tenants):
    service = MemoryService()
    fact_b = Fact.objects.get(pk=tenants["rows_b"]["facts"][2])  # B's global motto
    with in_workspace(tenants["b"]):
        out = io.StringIO()
        service.export_memories(out)
        exported = out.getvalue()
        assert MARK_B in exported and MARK_A not in exported
        service.delete_facts([fact_b.pk])
        report = service.import_memories(io.StringIO(exported))
        assert report.added.get("fact") == 1  # the deleted fact is back, the rest was present
    assert Fact.objects.get(pk=fact_b.pk).workspace_id == tenants["b"].pk
    with in_workspace(tenants["a"]):
        # B's rows (their ids are B's) are refused in A as a whole; nothing of them lands in A.
        with pytest.raises(ImportRejected):
            service.import_memories(io.StringIO(exported))
        assert not Fact.objects.filter(value__icontains=MARK_B).exists()


def test_limits_count_the_workspace_rows_only(tenants, settings):
    settings.MEMORY = {**getattr(settings, "MEMORY", {}), "LIMITS": {"MAX_EPISODES": 2}}
    service = MemoryService()
    b_episodes = Episode.objects.in_workspace(tenants["b"]).filter(agent_id=AGENT).count()
    with in_workspace(tenants["a"]):
        for _ in range(3):
            service.start_episode(agent_id=AGENT)
        assert Episode.objects.filter(agent_id=AGENT).count() == 2
    assert Episode.objects.in_workspace(tenants["b"]).filter(agent_id=AGENT).count() == b_episodes
    service.prune()  # the periodic prune, in no workspace: each workspace's groups apart
    assert Episode.objects.in_workspace(tenants["a"]).filter(agent_id=AGENT).count() == 2
    assert Episode.objects.in_workspace(tenants["b"]).filter(agent_id=AGENT).count() == b_episodes >= 1


def test_forgetting_a_person_acts_in_the_workspace_only(tenants, api_a):
    person_a, person_b = tenants["rows_a"]["person"], tenants["rows_b"]["person"]
    refused = api_a.post("/api/v1/memory-users/batch-delete/", {"ids": [person_b.pk], "cascade": True}, format="json")
    assert refused.status_code == 200 and refused.json()["not_found"] == [person_b.pk]
    assert MemoryUser.objects.filter(pk=person_b.pk).exists()
    forgotten = api_a.post("/api/v1/memory-users/batch-delete/", {"ids": [person_a.pk], "cascade": True}, format="json")
    assert forgotten.status_code == 200 and forgotten.json()["deleted"] == 1
    assert not MemoryUser.objects.filter(pk=person_a.pk).exists()
    assert Fact.objects.filter(user=person_b).count() == 1


def test_the_workspace_costs_no_query_of_its_own(tenants, api_a, django_user_model, client, operator_a):
    """A request of an operator in a workspace makes the queries of one without a workspace membership
    (the default workspace's), when both workspaces hold the same kinds of rows."""
    fill(DEFAULT_WORKSPACE_ID, "kiwi")
    plain = django_user_model.objects.create_user("operator-default", is_staff=True)
    api_default = APIClient()
    api_default.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=plain).key}")

    def queries(request):
        request()  # warm: content types, compiled statements
        with CaptureQueriesContext(connection) as captured:
            assert request().status_code == 200
        # The membership comes joined to the token's or session's user, never by a query of its own.
        assert not [q for q in captured.captured_queries if 'FROM "memory_workspace_member"' in q["sql"]]
        assert any('JOIN "memory_workspace_member"' in q["sql"] for q in captured.captured_queries)
        return len(captured.captured_queries)

    for path in ("/api/v1/facts/", "/api/v1/memory-users/", "/api/v1/workflows/"):
        assert queries(lambda p=path: api_a.get(p)) == queries(lambda p=path: api_default.get(p)), path
    client.force_login(operator_a)
    in_a = queries(lambda: client.get("/api/v1/facts/"))
    client.force_login(plain)
    assert in_a == queries(lambda: client.get("/api/v1/facts/"))


def test_a_slug_taken_in_another_workspace_is_a_400(api_a, tenants):
    taken = tenants["rows_b"]["workflows"][0]
    response = api_a.post(
        "/api/v1/workflows/", {"slug": taken, "name": "mine", "definition": DEMO_DEFINITION}, format="json"
    )
    assert response.status_code == 400 and "slug" in response.json()
    assert Workflow.objects.in_workspace(tenants["b"]).get(slug=taken).name == f"{MARK_B} flow"


def test_flush_puts_the_default_workspace_back(db):
    """`flush` (and every transactional test's teardown) empties the workspace table too; new rows
    default to the default workspace, so it must be there again (a foreign key on PostgreSQL)."""
    call_command("flush", interactive=False, verbosity=0)
    assert Workspace.objects.get(pk=DEFAULT_WORKSPACE_ID).slug == "default"
    person, _ = MemoryService().get_or_create_user("test", "after-a-flush")
    assert person.workspace_id == DEFAULT_WORKSPACE_ID
    assert Workspace.objects.create(slug="next").pk != DEFAULT_WORKSPACE_ID


def test_a_queryset_made_outside_a_workspace_holds_the_current_ones_rows(tenants):
    """As a viewset's class-level `queryset` is made once, at import: scoped when it runs."""
    made_unscoped = Workflow.objects.all()
    with in_workspace(tenants["a"]):
        made_in_a = Fact.objects.all()
    with in_workspace(tenants["b"]):
        assert {w.name for w in made_unscoped.all()} == {f"{MARK_B} flow"}
        assert made_in_a.count() == Fact.objects.in_workspace(tenants["b"]).count()
        assert all(MARK_B in json.dumps(f.value) for f in made_in_a)
    assert made_unscoped.count() == 2  # in no workspace: A's and B's


def test_related_managers_keep_to_the_workspace_of_the_row_they_go_through(tenants):
    """A workflow's runs, a person's reminders and a team's members (rows whose workspace is that of
    the row they point to) read through Django's related managers as through the model's own."""
    with in_workspace(tenants["a"]):
        workflow = Workflow.objects.get(slug=f"{MARK_A}-flow")
        assert [str(pk) for pk in workflow.runs.values_list("id", flat=True)] == [
            str(r) for r in tenants["rows_a"]["runs"]
        ]
        person = tenants["rows_a"]["person"]
        assert list(person.reminders.values_list("pk", flat=True)) == tenants["rows_a"]["reminders"]
        team = MemoryService().get_team(f"{MARK_A} crew")
        assert list(team.members.values_list("agent_id", flat=True)) == [AGENT]
