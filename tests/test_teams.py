"""Team scope: facts shared by a named group of agents, between the agent's own and global.

Lookup order: session < user < agent < team < global (most specific wins). Through the service,
search, recall, point-in-time reads, history, erasure and the owner-key definition.
"""

import io
import json

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from memory.exceptions import ImportRejected, InvalidMemoryArgument, MemoryNotFound
from memory.models import Fact, FactVersion, RecallDocument, Scope, Team, TeamMember
from memory.models.owners import fact_owner_key, owner_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def crew(service):
    """Team "ops" of agents a1 and a2; agent x1 belongs to no team."""
    return service.create_team("ops", agent_ids=["a1", "a2"], description="on-call crew")


def test_team_fact_beats_global_and_agent_fact_beats_team(service, crew):
    service.set_fact("deploy_window", "any time", scope="global")
    service.set_fact("deploy_window", "weekdays 9-17", scope="team", team="ops")
    assert service.get_fact("deploy_window", agent_id="a1").value == "weekdays 9-17"
    assert service.get_fact("deploy_window", agent_id="a2").value == "weekdays 9-17"
    service.set_fact("deploy_window", "never on Fridays", scope="agent", agent_id="a2")
    assert service.get_fact("deploy_window", agent_id="a2").value == "never on Fridays"
    assert service.get_fact("deploy_window", agent_id="a1").value == "weekdays 9-17"


def test_an_agent_outside_the_team_does_not_see_it(service, crew, user_factory):
    service.set_fact("runbook", "page the lead", scope="team", team="ops")
    assert service.get_fact("runbook", agent_id="x1") is None
    assert service.get_fact("runbook") is None
    assert service.get_fact("runbook", user_id=user_factory("ada").pk) is None
    assert service.search_facts("runbook", agent_id="x1") == []
    assert service.list_facts(agent_id="x1") == []
    service.set_fact("runbook", "ask around", scope="global")
    assert service.get_fact("runbook", agent_id="x1").value == "ask around"


def test_user_and_session_facts_still_beat_team_facts(service, crew, user_factory):
    ada = user_factory("ada")
    service.set_fact("tone", "terse", scope="team", team="ops")
    service.set_fact("tone", "warm", scope="user", user_id=ada.pk)
    assert service.get_fact("tone", agent_id="a1", user_id=ada.pk).value == "warm"
    service.set_fact("tone", "playful", scope="session", session_id="s1")
    assert service.get_fact("tone", agent_id="a1", user_id=ada.pk, session_id="s1").value == "playful"


def test_an_agent_in_two_teams_sees_both_and_membership_changes_apply_at_once(service, crew):
    service.create_team("db", agent_ids=["a1"])
    service.set_fact("ops_rule", "one", scope="team", team="ops")
    service.set_fact("db_rule", "two", scope="team", team="db")
    assert {f.key for f in service.list_facts(agent_id="a1")} == {"db_rule", "ops_rule"}
    assert {f.key for f in service.list_facts(agent_id="a2")} == {"ops_rule"}
    service.set_team_members("db", add=["a2"], remove=["a1"])
    assert {f.key for f in service.list_facts(agent_id="a1")} == {"ops_rule"}
    assert {f.key for f in service.list_facts(agent_id="a2")} == {"db_rule", "ops_rule"}


def test_a_get_stays_one_query_for_a_team_member(service, crew, capture_data_queries):
    service.set_fact("k", "team", scope="team", team="ops")
    service.set_fact("k", "global", scope="global")
    with capture_data_queries() as queries:
        assert service.get_fact("k", agent_id="a1", user_id=None, session_id="s").value == "team"
    assert len(queries.data) == 1


def test_search_ranks_and_shadows_team_facts(service, crew):
    service.set_fact("escalation_contact", "global desk", scope="global", confidence=0.99)
    service.set_fact("escalation_contact", "ops lead", scope="team", team="ops", confidence=0.5)
    service.set_fact("escalation_policy", "ops policy", scope="team", team="ops", confidence=0.6)
    found = service.search_facts("escalation", agent_id="a1", min_confidence=0.0)
    assert [(f.key, f.value) for f in found] == [
        ("escalation_policy", "ops policy"),
        ("escalation_contact", "ops lead"),
    ]
    outside = service.search_facts("escalation", agent_id="x1", min_confidence=0.0)
    assert [(f.key, f.value) for f in outside] == [("escalation_contact", "global desk")]


def test_search_of_a_selective_word_finds_team_facts(service, crew):
    # A rare word goes through the keyword index with the viewer's owners (SQLite: owner markers).
    for n in range(30):
        service.set_fact(f"noise_{n}", f"value {n}", scope="global")
    service.set_fact("pager_rotation", "zanzibar schedule", scope="team", team="ops")
    service.set_fact("other_rotation", "zanzibar elsewhere", scope="agent", agent_id="x1")
    for indexed in (False, True):  # waiting in the index's delta, then in the index itself
        assert [f.key for f in service.search_facts("zanzibar", agent_id="a2")] == ["pager_rotation"], indexed
        assert [f.key for f in service.search_facts("zanzibar", agent_id="x1")] == ["other_rotation"], indexed
        assert service.search_facts("zanzibar") == []
        service.optimize_search_index()  # moves the delta into the index


def test_write_errors_name_the_field_and_write_nothing(service, crew):
    with pytest.raises(InvalidMemoryArgument) as err:
        service.set_fact("k", "v", scope="team", team="nobody")
    assert err.value.field == "team"
    with pytest.raises(InvalidMemoryArgument) as err:
        service.set_fact("k", "v", scope="team")
    assert err.value.field == "team"
    with pytest.raises(InvalidMemoryArgument) as err:
        service.set_fact("k", "v", scope="team", team="ops", agent_id="x1")
    assert err.value.field == "agent_id"
    assert "not a member" in err.value.message
    with pytest.raises(InvalidMemoryArgument) as err:
        service.set_fact("k", "v", scope="global", team="ops")
    assert err.value.field == "team"
    assert not Fact.objects.exists()
    write = service.set_fact("k", "v", scope="team", team="ops", agent_id="a1")
    assert (write.fact.scope, write.fact.team_id, write.fact.agent_id) == ("team", crew.pk, "")
    assert service.set_fact("k", "v", scope="team", team=crew.pk).action == "confirmed"


def test_team_names_are_unique_and_not_blank(service, crew):
    with pytest.raises(InvalidMemoryArgument) as err:
        service.create_team("ops")
    assert err.value.field == "name"
    with pytest.raises(InvalidMemoryArgument) as err:
        service.create_team("  ")
    assert err.value.field == "name"
    with pytest.raises(InvalidMemoryArgument) as err:
        service.create_team("x", agent_ids="a1")
    assert err.value.field == "agent_ids"
    assert list(Team.objects.values_list("name", flat=True)) == ["ops"]
    assert service.team_members("ops") == ["a1", "a2"]
    assert [t.name for t in service.list_teams(agent_id="a1")] == ["ops"]
    assert list(service.list_teams(agent_id="x1")) == []


def test_the_database_keeps_a_team_fact_owned_by_its_team_only(crew):
    with pytest.raises(IntegrityError), transaction.atomic():
        Fact.objects.create(key="k", value=1, scope=Scope.TEAM)  # no team
    with pytest.raises(IntegrityError), transaction.atomic():
        Fact.objects.create(key="k", value=1, scope=Scope.GLOBAL, team=crew)
    with pytest.raises(IntegrityError), transaction.atomic():
        Fact.objects.create(key="k", value=1, scope=Scope.TEAM, team=crew, agent_id="a1")
    with pytest.raises(IntegrityError), transaction.atomic():
        TeamMember.objects.create(team=crew, agent_id="a1")  # once per team


def test_owner_key_and_recall_document_owner_agree(service, crew):
    fact = Fact.objects.get(pk=service.set_fact("k", "v", scope="team", team="ops").fact.pk)
    assert fact.scope_key == fact_owner_key(fact) == owner_key(Scope.TEAM, team_id=crew.pk) == f"team:{crew.pk}"
    assert RecallDocument.objects.get(kind="fact", item_id=fact.pk).owner == fact.scope_key
    # A fact moved to another team changes owner in the recall index too (its trigger watches team_id).
    other = service.create_team("db", agent_ids=["a3"])
    Fact.objects.filter(pk=fact.pk).update(team=other)
    assert RecallDocument.objects.get(kind="fact", item_id=fact.pk).owner == f"team:{other.pk}"
    assert service.get_fact("k", agent_id="a3").value == "v"
    assert service.search_facts("k v", agent_id="a3", min_confidence=0.0)[0].pk == fact.pk
    assert service.get_fact("k", agent_id="a1") is None


def test_recall_finds_team_facts_for_members_only(service, crew):
    service.set_fact("incident_channel", "the ops incident channel is #fire", scope="team", team="ops")
    service.set_fact("lunch_spot", "the cafeteria on floor two", scope="global")
    hits = service.recall("which incident channel should I use", agent_id="a1", types=["facts"])
    assert [h.id for h in hits.hits][:1] == [Fact.objects.get(key="incident_channel").pk]
    outside = service.recall("which incident channel should I use", agent_id="x1", types=["facts"])
    assert Fact.objects.get(key="incident_channel").pk not in [h.id for h in outside.hits]


def test_point_in_time_reads_and_history_see_team_facts(service, crew):
    before = timezone.now()
    service.set_fact("oncall", "ann", scope="team", team="ops")
    service.set_fact("oncall", "bob", scope="team", team="ops")
    assert service.get_fact("oncall", agent_id="a1", as_of=timezone.now()).value == "bob"
    assert service.get_fact("oncall", agent_id="a1", as_of=before) is None
    versions = service.fact_history(key="oncall", scope="team", team="ops")
    assert [v.value for v in versions] == ["ann", "bob"]
    assert service.get_fact("oncall", agent_id="x1", as_of=timezone.now()) is None


def test_deleting_a_team_deletes_its_facts_and_keeps_their_history(service, crew):
    fact = service.set_fact("oncall", "ann", scope="team", team="ops").fact
    assert service.delete_team("ops") == 1
    assert not Fact.objects.filter(pk=fact.pk).exists()
    assert not TeamMember.objects.exists()
    assert FactVersion.objects.filter(fact_id=fact.pk, action="deleted").exists()
    with pytest.raises(MemoryNotFound):
        service.delete_team("ops")


def test_forgetting_a_person_leaves_team_facts(service, crew, user_factory):
    ada = user_factory("ada")
    service.set_fact("pref", "tea", scope="user", user_id=ada.pk)
    team_fact = service.set_fact("runbook", "page the lead", scope="team", team="ops").fact
    service.delete_users([ada.pk], cascade=True)
    assert Fact.objects.filter(pk=team_fact.pk).exists()
    assert service.get_fact("runbook", agent_id="a1").value == "page the lead"


def test_pinned_team_facts_reach_members(service, crew):
    fact = service.set_fact("rule", "no deploys friday", scope="team", team="ops").fact
    service.pin_memories("fact", [fact.pk])
    facts, _ = service.pinned_memories(agent_id="a1")
    assert [f.pk for f in facts] == [fact.pk]
    assert service.pinned_memories(agent_id="x1")[0] == []


def test_the_lookup_is_one_statement_on_postgresql_too(service, crew, requires_postgres):
    service.set_fact("k", "team", scope="team", team="ops")
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM memory_team_member")
        assert cursor.fetchone()[0] == 2
    assert service.get_fact("k", agent_id="a2").value == "team"


# ------------------------------------------------------------------ REST API


def test_rest_creates_lists_filters_and_deletes_teams(api, service):
    created = api.post("/api/v1/teams/", {"name": "ops", "agent_ids": ["a2", "a1"]}, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["agent_ids"] == ["a1", "a2"]
    api.post("/api/v1/teams/", {"name": "db", "agent_ids": ["a3"]}, format="json")
    assert [t["name"] for t in api.get("/api/v1/teams/").json()["results"]] == ["db", "ops"]
    assert [t["name"] for t in api.get("/api/v1/teams/?agent_id=a1").json()["results"]] == ["ops"]
    taken = api.post("/api/v1/teams/", {"name": "ops"}, format="json")
    assert taken.status_code == 400 and "name" in taken.json()
    ops = created.json()["id"]
    moved = api.post(f"/api/v1/teams/{ops}/members/", {"add": ["a4"], "remove": ["a1"]}, format="json")
    assert moved.json()["agent_ids"] == ["a2", "a4"]
    service.set_fact("runbook", "page", scope="team", team="ops")
    assert api.delete(f"/api/v1/teams/{ops}/").status_code == 204
    assert not Team.objects.filter(pk=ops).exists() and not Fact.objects.filter(key="runbook").exists()
    assert api.get("/api/v1/teams/9999/").status_code == 404


def test_rest_writes_and_reads_team_facts(api, service, crew):
    written = api.post(
        "/api/v1/facts/", {"key": "runbook", "value": "page the lead", "scope": "team", "team": "ops"}, format="json"
    )
    assert written.status_code == 201, written.json()
    assert (written.json()["fact"]["scope"], written.json()["fact"]["scope_key"]) == ("team", f"team:{crew.pk}")
    api.post("/api/v1/facts/", {"key": "runbook", "value": "ask around", "scope": "global"}, format="json")
    seen = api.get("/api/v1/facts/lookup/", {"key": "runbook", "agent_id": "a1"}).json()["fact"]
    assert seen["value"] == "page the lead"
    outside = api.get("/api/v1/facts/lookup/", {"key": "runbook", "agent_id": "x1"}).json()["fact"]
    assert outside["value"] == "ask around"
    listed = api.get("/api/v1/facts/", {"team": "ops"}).json()["results"]
    assert [(f["key"], f["team"]) for f in listed] == [("runbook", "ops")]
    assert [f["key"] for f in api.get("/api/v1/facts/", {"scope": "team"}).json()["results"]] == ["runbook"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"scope": "team", "team": "nobody"}, "team"),
        ({"scope": "team"}, "team"),
        ({"scope": "team", "team": "ops", "agent_id": "x1"}, "agent_id"),
        ({"scope": "agent", "agent_id": "a1", "team": "ops"}, "team"),
    ],
)
def test_rest_fact_errors_name_the_field_and_write_nothing(api, crew, body, field):
    response = api.post("/api/v1/facts/", {"key": "k", "value": "v", **body}, format="json")
    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert not Fact.objects.exists()


def test_rest_filter_by_an_unknown_team_is_an_error_naming_it(api, crew):
    response = api.get("/api/v1/facts/", {"team": "nobody"})
    assert response.status_code == 400 and list(response.json()) == ["team"]
    members = api.post(f"/api/v1/teams/{crew.pk}/members/", {"add": [""]}, format="json")
    assert members.status_code == 400 and "add" in members.json()


# ------------------------------------------------------------------ the /memories/ admin


def test_admin_adds_a_team_with_members_and_lists_it(staff_client):
    response = staff_client.post(
        "/memories/memory/team/add/",
        {
            "name": "ops",
            "description": "",
            "members-TOTAL_FORMS": "2",
            "members-INITIAL_FORMS": "0",
            "members-0-agent_id": "a1",
            "members-1-agent_id": "a2",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert sorted(TeamMember.objects.values_list("agent_id", flat=True)) == ["a1", "a2"]
    listing = staff_client.get("/memories/memory/team/").content.decode()
    assert "ops" in listing and "a1, a2" in listing


def test_admin_fact_list_filters_team_facts_and_names_the_team(staff_client, service, crew):
    service.set_fact("runbook", "page the lead", scope="team", team="ops")
    service.set_fact("motto", "ship it", scope="global")
    page = staff_client.get("/memories/memory/fact/", {"scope__exact": "team"})
    assert [f.key for f in page.context["cl"].result_list] == ["runbook"]
    assert "team ops" in page.content.decode()
    by_team = staff_client.get("/memories/memory/fact/", {"team__id__exact": crew.pk})
    assert [f.key for f in by_team.context["cl"].result_list] == ["runbook"]


def test_admin_deletes_a_team_with_its_facts(staff_client, service, crew):
    service.set_fact("runbook", "page the lead", scope="team", team="ops")
    response = staff_client.post(
        "/memories/memory/team/", {"action": "delete_memories", "_selected_action": [crew.pk], "post": "yes"}
    )
    assert response.status_code == 302
    assert not Team.objects.exists() and not Fact.objects.exists()


# ------------------------------------------------------------------ export and import


def test_export_clear_import_round_trips_teams_and_team_facts(service, crew):
    service.set_fact("runbook", "page the lead", scope="team", team="ops")
    service.set_fact("runbook", "page the manager", scope="team", team="ops")  # a version of a team fact
    out = io.StringIO()
    service.export_memories(out)
    text = out.getvalue()
    header = json.loads(text.splitlines()[0])
    assert (header["counts"]["team"], header["counts"]["team_member"]) == (1, 2)
    before = list(Fact.objects.values_list("id", "scope_key", "team_id", "value"))
    versions = list(FactVersion.objects.values_list("id", "scope_key", "team_id", "value"))
    service.delete_team("ops")
    assert not Fact.objects.exists()
    report = service.import_memories(io.StringIO(text))
    assert (report.added["team"], report.added["team_member"], report.added["fact"]) == (1, 2, 1)
    assert list(Fact.objects.values_list("id", "scope_key", "team_id", "value")) == before
    assert [v[1:] for v in versions] == [(f"team:{crew.pk}", crew.pk, "page the lead")]
    assert set(versions) <= set(FactVersion.objects.values_list("id", "scope_key", "team_id", "value"))
    assert service.get_fact("runbook", agent_id="a2").value == "page the manager"
    assert service.search_facts("manager", agent_id="a1")[0].key == "runbook"


def test_an_import_of_a_team_fact_without_its_team_names_the_field(service, crew):
    service.set_fact("runbook", "page the lead", scope="team", team="ops")
    out = io.StringIO()
    service.export_memories(out)
    lines = out.getvalue().splitlines()
    rows = [json.loads(line) for line in lines]
    for n, row in enumerate(rows):
        if row.get("kind") == "fact":
            row["team_id"] = None
            lines[n] = json.dumps(row)
    service.delete_team("ops")
    with pytest.raises(ImportRejected) as err:
        service.import_memories(io.StringIO("\n".join(lines)))
    assert "team_id" in str(err.value)
    assert not Fact.objects.exists() and not Team.objects.exists()
