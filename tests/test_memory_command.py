"""`manage.py memory`: each subcommand through call_command, as tables and as JSON."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

from memory.models import Episode, Fact, MemoryUser

pytestmark = pytest.mark.django_db


def run(*args, stdin=None):
    out, err = io.StringIO(), io.StringIO()
    call_command("memory", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def run_json(*args):
    out, _ = run(*args, "--json")
    return json.loads(out)


@pytest.fixture
def store(service, user_factory):
    ada = user_factory("ada")
    service.set_fact("favourite_colour", "green", scope="user", user_id=ada.pk, fact_type="user_preference")
    service.set_fact("timezone", "UTC", scope="agent", agent_id="planner")
    service.set_fact("office_city", "Porto")
    episode = service.start_episode(agent_id="planner", user_id=ada.pk, trigger_type="telegram")
    service.add_message(episode.pk, "user", "My favourite tea is oolong.")
    service.complete_episode(episode.pk, success=True, summary="talked tea")
    service.save_procedure("weather", agent_id="planner", content={"prompt": "city?"})
    return {"ada": ada, "episode": episode}


def test_list_facts_as_a_table_and_as_json(store):
    out, _ = run("list")
    assert "favourite_colour" in out and "office_city" in out
    data = run_json("list", "--scope", "user")
    assert data["type"] == "facts" and data["count"] == 1
    assert data["items"][0]["key"] == "favourite_colour" and data["items"][0]["owner"] == f"user:{store['ada'].pk}"
    assert run_json("list", "--agent", "planner")["items"][0]["key"] == "timezone"
    assert run_json("list", "--category", "user_preference")["count"] == 1
    assert run_json("list", "--limit", "1")["count"] == 1


@pytest.mark.parametrize(
    "kind, expected", [("episodes", "talked tea"), ("procedures", "weather"), ("users", "test:ada")]
)
def test_list_other_types(store, kind, expected):
    out, _ = run("list", "--type", kind)
    assert expected in out
    assert run_json("list", "--type", kind)["count"] == 1


def test_list_with_a_filter_that_does_not_apply_names_it(store):
    with pytest.raises(CommandError, match="scope: does not apply to episodes"):
        run("list", "--type", "episodes", "--scope", "user")
    with pytest.raises(CommandError, match="category: must be one of"):
        run("list", "--category", "gossip")


def test_stats(store):
    data = run_json("stats")
    assert data["facts"] == 3 and data["facts_by_scope"] == {
        "session": 0,
        "user": 1,
        "agent": 1,
        "team": 0,
        "global": 1,
    }
    assert data["episodes_unconsolidated"] == 1 and data["last_consolidation"] is None
    out, _ = run("stats")
    assert "waiting for consolidation" in out and "No consolidation has run yet." in out


def test_consolidate_then_stats_and_health(store):
    data = run_json("consolidate")
    assert data["ok"] and data["episodes_processed"] == 1 and data["facts"]["created"] == 1
    assert Fact.objects.get(key="favourite_tea").value == "oolong"
    assert run_json("stats")["last_consolidation"]["episodes_processed"] == 1
    health = run_json("health")
    assert health["band"] in {"green", "yellow", "red"} and set(health["metrics"]) == {
        "freshness",
        "coverage",
        "coherence",
        "efficiency",
        "reachability",
    }
    out, _ = run("health")
    assert "Memory health" in out and "coverage" in out


def test_consolidate_fails_with_exit_status_when_an_episode_fails(store, settings):
    settings.MEMORY = {**settings.MEMORY, "CONSOLIDATION": {"EXTRACTOR": "memory.consolidation.LLMExtractor"}}
    with pytest.raises(CommandError) as info:
        run("consolidate")
    assert info.value.returncode == 1
    assert not Episode.objects.filter(processed_for_facts=True).exists()


def test_export_clear_import_round_trip(store, tmp_path):
    path = tmp_path / "memories.jsonl"
    _, err = run("export", "-o", str(path))
    assert "exported 1 user, 1 identity, 1 episode, 1 procedure, 0 team, 0 team_member, 3" in err
    assert json.loads(path.read_text().splitlines()[0])["format"] == "engram-memory"
    assert run_json("clear", "--force")["deleted"]["facts"] == 3
    assert Fact.objects.count() == 0
    data = run_json("import", str(path))
    assert data["added"] == {
        "user": 1,
        "identity": 1,
        "episode": 1,
        "procedure": 1,
        "team": 0,
        "team_member": 0,
        "fact": 3,
        "fact_version": 0,  # nothing superseded: each fact's current version is its row
        "store_item": 0,
        "promotion": 0,
        "relation": 0,
        "reminder": 0,
    }
    again = run_json("import", str(path))
    assert sum(again["added"].values()) == 0 and again["present"]["fact"] == 3


def test_export_to_standard_output(store):
    out, _ = run("export")
    lines = out.splitlines()
    # 3 facts (each its own current version: none superseded, so no fact_version rows)
    assert json.loads(lines[0])["counts"]["fact"] == 3 and len(lines) == 8


def test_import_of_a_malformed_file_names_line_and_field(store, tmp_path):
    path = tmp_path / "memories.jsonl"
    run("export", "-o", str(path))
    lines = path.read_text().splitlines()
    row = json.loads(lines[-1])
    row["confidence"] = 3
    lines[-1] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    run("clear", "--force")
    with pytest.raises(CommandError) as info:
        run("import", str(path))
    assert f"line {len(lines)}: confidence: must be from 0 to 1" in str(info.value)
    assert "nothing was written" in str(info.value)
    assert MemoryUser.objects.count() == 0


def test_clear_asks_unless_forced(store, monkeypatch):
    monkeypatch.setattr("sys.stdin", type("Tty", (io.StringIO,), {"isatty": lambda self: True})())
    monkeypatch.setattr("builtins.input", lambda prompt: "no")
    with pytest.raises(CommandError, match="nothing deleted"):
        run("clear", "--type", "facts")
    assert Fact.objects.count() == 3
    monkeypatch.setattr("builtins.input", lambda prompt: "yes")
    out, _ = run("clear", "--type", "facts", "--scope", "global")
    assert "deleted 1 facts" in out
    assert Fact.objects.count() == 2


def test_clear_without_a_terminal_needs_force(store, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO())
    with pytest.raises(CommandError, match="--force"):
        run("clear")
    assert Fact.objects.count() == 3


def test_clear_by_agent_and_user(store):
    assert run_json("clear", "--agent", "planner", "--force")["deleted"] == {"facts": 1, "episodes": 1, "procedures": 1}
    deleted = run_json("clear", "--user", str(store["ada"].pk), "--force")["deleted"]
    assert deleted["users"] == 1 and deleted["facts"] == 1
    assert list(Fact.objects.values_list("key", flat=True)) == ["office_city"]


def test_clear_sessions_takes_session_facts_only(store, service):
    service.set_fact("topic", "tea", scope="session", session_id="ada:direct:1")
    service.set_fact("mood", "curious", scope="session", session_id="bob:direct:1")
    assert run_json("clear", "--sessions", "--force")["deleted"] == {"facts": 2}
    assert sorted(Fact.objects.values_list("scope", flat=True)) == ["agent", "global", "user"]
    assert Episode.objects.count() == 1  # a session's episodes are its record, not its notes
    for extra in (["--agent", "planner"], ["--user", str(store["ada"].pk)], ["--type", "episodes"]):
        with pytest.raises(CommandError, match=f"leave out {extra[0]}"):
            run("clear", "--sessions", *extra, "--force")
    assert Fact.objects.count() == 3


def test_prune(store, settings):
    settings.MEMORY = {**settings.MEMORY, "LIMITS": {"MAX_FACTS": 0}}
    assert run_json("prune", "--dry-run")["deleted"]["facts"] == 3
    assert Fact.objects.count() == 3
    data = run_json("prune")
    assert data["deleted"]["facts"] == 3 and Fact.objects.count() == 0
    out, _ = run("prune")
    assert "Prune" in out


def test_history_of_a_fact_by_id_and_by_key(store):
    from memory.service import MemoryService

    service, ada = MemoryService(), store["ada"]
    fact = Fact.objects.get(key="favourite_colour")
    service.set_fact("favourite_colour", "blue", scope="user", user_id=ada.pk, provenance="said so")
    service.delete_fact(fact.pk)
    out, _ = run("history", str(fact.pk))
    assert "History of fact" in out and "3 versions" in out
    assert "created" in out and "updated" in out and "deleted" in out and "said so" in out
    data = run_json("history", "--key", "favourite_colour", "--user", str(ada.pk))
    assert [(v["action"], v["value"]) for v in data["versions"]] == [
        ("created", "green"),
        ("updated", "blue"),
        ("deleted", "blue"),
    ]
    assert data["versions"][0]["owner"] == f"user:{ada.pk}"
    assert run_json("history", "--key", "timezone", "--agent", "planner")["count"] == 1
    assert run_json("history", "--key", "office_city")["versions"][0]["value"] == "Porto"
    team = service.create_team("ops", agent_ids=["planner"])
    service.set_fact("rota", "weekly", scope="team", team="ops")
    service.set_fact("rota", "daily", scope="team", team="ops")
    rota = run_json("history", "--key", "rota", "--team", "ops")["versions"]
    assert [(v["value"], v["owner"]) for v in rota] == [("weekly", f"team:{team.pk}"), ("daily", f"team:{team.pk}")]
    assert run_json("history", str(fact.pk), "--limit", "1")["versions"][0]["action"] == "deleted"
    with pytest.raises(CommandError, match="fact_id"):
        run("history")
    with pytest.raises(CommandError, match="limit"):
        run("history", str(fact.pk), "--limit", "0")
