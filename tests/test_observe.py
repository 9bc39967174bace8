"""MemoryService.observe: facts extracted from a turn and reconciled with what is stored (add, update,
delete, none), and the remember node's `extract` mode. The chat model is LangChain's generic fake,
answering with the tool calls a model with structured output makes."""

import pytest
from django.utils import timezone
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from memory.exceptions import InvalidMemoryArgument
from memory.models import Fact, FactHistory, FactVersion
from workflows.graph.nodes import build_remember
from workflows.language.registry import BuildContext

pytestmark = pytest.mark.django_db


class ToolCallingFake(GenericFakeChatModel):
    """LangChain's generic fake model answering with tool calls, as models with structured output do."""

    def bind_tools(self, tools, **kwargs):
        return self


class BrokenModel(ToolCallingFake):
    def _generate(self, *args, **kwargs):
        raise ConnectionError("the model's server hung up")


def call(name, args):
    return AIMessage(content="", tool_calls=[{"name": name, "id": f"call-{name}", "args": args}])


def proposal(key, value, words="", message=0, scope="user", fact_type="user_preference"):
    return {"key": key, "value": value, "fact_type": fact_type, "scope": scope, "words": words, "message": message}


def scripted(proposals, decisions=None):
    answers = [call("ProposedFacts", {"facts": proposals})]
    if decisions is not None:
        answers.append(call("Decisions", {"decisions": decisions}))
    return ToolCallingFake(messages=iter(answers))


def snapshot():
    """Every fact as stored (key, value, owner, counters, provenance, updated_at) and every history version."""
    facts = {
        f.key: (f.value, f.scope_key, f.times_confirmed, f.times_contradicted, f.provenance, f.updated_at)
        for f in Fact.objects.all()
    }
    return facts, FactVersion.objects.count()


@pytest.fixture
def ada(user_factory):
    return user_factory("ada")


@pytest.fixture
def turn(service, ada):
    """A recorded turn (its episode) and its messages."""
    messages = [HumanMessage("I'm vegetarian now, and I moved to Lisbon.", id="m-1"), AIMessage("Noted!", id="m-2")]
    episode = service.record_episode(
        started_at=timezone.now(),
        success=True,
        agent_id="helper",
        user_id=ada.pk,
        conversation=[{"role": "user", "content": messages[0].content}, {"role": "assistant", "content": "Noted!"}],
    )
    return episode, messages


def test_add_stores_the_fact_linked_to_its_turn_and_nothing_else(service, ada, turn):
    episode, messages = turn
    service.set_fact("tea", "green", scope="user", user_id=ada.pk)
    before, versions = snapshot()
    model = scripted(
        [proposal("diet", "vegetarian", words="I'm vegetarian now")],
        [{"proposal": 0, "action": "add", "reason": "nothing stored about diet"}],
    )
    report = service.observe(messages, user_id=ada.pk, agent_id="helper", chat_model=model, episode_id=episode.pk)
    assert report.ok, report.as_dict()
    assert report.model_calls == 2
    [decision] = report.decisions
    assert (decision["action"], decision["key"], decision["write"]) == ("add", "diet", "created")
    assert decision["reason"] == "nothing stored about diet"
    diet = Fact.objects.get(key="diet")
    assert (diet.value, diet.scope, diet.user_id, diet.fact_type) == ("vegetarian", "user", ada.pk, "user_preference")
    # The turn it came from: its episode, and in its provenance the message and the words.
    assert diet.source_episode_id == episode.pk
    assert diet.provenance == 'observe (message m-1): "I\'m vegetarian now"'
    after, after_versions = snapshot()
    assert {k: v for k, v in after.items() if k != "diet"} == before and after_versions == versions


def test_update_changes_the_stored_fact_it_names_and_keeps_its_history(service, ada, turn):
    episode, messages = turn
    home = service.set_fact("home_city", "Porto", scope="user", user_id=ada.pk, provenance="told").fact
    service.set_fact("tea", "green", scope="user", user_id=ada.pk)
    before, _ = snapshot()
    model = scripted(
        [proposal("city", "Lisbon", words="I moved to Lisbon", fact_type="world_knowledge")],
        [{"proposal": 0, "action": "update", "key": "home_city", "reason": "she moved"}],
    )
    report = service.observe(messages, user_id=ada.pk, chat_model=model, episode_id=episode.pk)
    assert report.ok, report.as_dict()
    assert [(d["action"], d["key"], d["write"], d["fact_id"]) for d in report.decisions] == [
        ("update", "home_city", "updated", home.pk)
    ]
    home.refresh_from_db()
    assert (home.value, home.source_episode_id, home.times_contradicted) == ("Lisbon", episode.pk, 1)
    assert [(v.action, v.value) for v in service.fact_history(home.pk)] == [("created", "Porto"), ("updated", "Lisbon")]
    after, _ = snapshot()
    assert not Fact.objects.filter(key="city").exists()  # updated in place, not added beside it
    assert {k: v for k, v in after.items() if k != "home_city"} == {k: v for k, v in before.items() if k != "home_city"}


def test_delete_removes_the_fact_it_names_and_its_history_keeps_it(service, ada, turn):
    episode, messages = turn
    steak = service.set_fact("favourite_food", "steak", scope="user", user_id=ada.pk).fact
    service.set_fact("tea", "green", scope="user", user_id=ada.pk)
    before, _ = snapshot()
    model = scripted(
        [proposal("diet", "vegetarian: no meat, no steak", words="I'm vegetarian now")],
        [{"proposal": 0, "action": "delete", "key": "favourite_food", "reason": "vegetarians eat no steak"}],
    )
    report = service.observe(messages, user_id=ada.pk, chat_model=model, episode_id=episode.pk)
    assert report.ok, report.as_dict()
    assert [(d["action"], d["key"], d["write"]) for d in report.decisions] == [("delete", "favourite_food", "deleted")]
    assert not Fact.objects.filter(pk=steak.pk).exists()
    assert [(v.action, v.value) for v in FactHistory.objects.filter(fact_id=steak.pk).order_by("valid_from")] == [
        ("created", "steak"),
        ("deleted", "steak"),
    ]
    after, _ = snapshot()
    assert after == {k: v for k, v in before.items() if k != "favourite_food"}  # and no diet: it was not added


def test_none_changes_nothing(service, ada, turn):
    episode, messages = turn
    service.set_fact("diet", "vegetarian", scope="user", user_id=ada.pk)
    before = snapshot()
    model = scripted(
        [proposal("diet", "vegetarian", words="I'm vegetarian now")],
        [{"proposal": 0, "action": "none", "reason": "already known"}],
    )
    report = service.observe(messages, user_id=ada.pk, chat_model=model, episode_id=episode.pk)
    assert report.ok and report.counts() == {"add": 0, "update": 0, "delete": 0, "none": 1}
    assert snapshot() == before


def test_an_add_and_a_delete_for_one_proposal(service, ada, turn):
    episode, messages = turn
    service.set_fact("favourite_food", "steak", scope="user", user_id=ada.pk)
    model = scripted(
        [proposal("diet", "vegetarian: no meat, no steak", words="I'm vegetarian now")],
        [
            {"proposal": 0, "action": "add", "reason": "new"},
            {"proposal": 0, "action": "delete", "key": "favourite_food", "reason": "no longer true"},
        ],
    )
    report = service.observe(messages, user_id=ada.pk, chat_model=model, episode_id=episode.pk)
    assert report.ok, report.as_dict()
    assert sorted(Fact.objects.values_list("key", flat=True)) == ["diet"]


def test_the_model_is_shown_the_stored_facts_a_proposal_touches(service, ada, turn, user_factory):
    """Recall (by meaning, and its keyword leg: the word "food") and the same key; never another person's facts."""
    episode, messages = turn
    service.set_fact("favourite_food", "steak", scope="user", user_id=ada.pk)
    service.set_fact("diet", "omnivore", scope="user", user_id=ada.pk)
    service.set_fact("car", "red bicycle", scope="user", user_id=user_factory("bob").pk)
    report = service.observe(
        messages,
        user_id=ada.pk,
        chat_model=scripted(
            [proposal("diet", "vegetarian food")],
            [{"proposal": 0, "action": "update", "key": "favourite_food", "reason": "shown"}],
        ),
    )
    assert report.ok, report.as_dict()  # favourite_food was among the candidates, or the update would be refused
    refused = service.observe(
        messages,
        user_id=ada.pk,
        chat_model=scripted(
            [proposal("diet", "vegetarian food")],
            [{"proposal": 0, "action": "delete", "key": "car", "reason": "not shown"}],
        ),
    )
    assert "not among the stored facts" in refused.errors[0]
    assert Fact.objects.get(key="car").value == "red bicycle"


def test_each_proposal_of_a_turn_is_shown_its_own_stored_facts(service, ada, turn):
    """Two proposals in one turn (their candidates looked up together): each one's update finds its fact."""
    episode, messages = turn
    food = service.set_fact("favourite_food", "steak", scope="user", user_id=ada.pk).fact
    home = service.set_fact("home_city", "Porto", scope="user", user_id=ada.pk).fact
    model = scripted(
        # Keys other than the stored ones: only recall (by meaning, or the words "food" and "city") finds them.
        [proposal("food", "vegetables, no more steak"), proposal("city", "Lisbon", fact_type="world_knowledge")],
        [
            {"proposal": 0, "action": "update", "key": "favourite_food", "reason": "vegetarian now"},
            {"proposal": 1, "action": "update", "key": "home_city", "reason": "she moved"},
        ],
    )
    report = service.observe(messages, user_id=ada.pk, chat_model=model, episode_id=episode.pk)
    assert report.ok, report.as_dict()
    assert [(d["key"], d["fact_id"]) for d in report.decisions] == [("favourite_food", food.pk), ("home_city", home.pk)]
    food.refresh_from_db()
    home.refresh_from_db()
    assert (food.value, home.value) == ("vegetables, no more steak", "Lisbon")


def test_a_stored_fact_only_the_turns_meaning_finds_is_shown_with_an_embedder(service, ada, turn):
    """ "diet: vegetarian" shares no word with "favourite_food: steak"; with an embedder, the turn's
    meaning ("I'm vegetarian now") finds it among unrelated facts; keyword-only, it is not shown."""
    episode, messages = turn
    for n, hobby in enumerate(["tuned the old piano", "knitted a wool scarf", "ran a half marathon", "played chess"]):
        service.set_fact(f"hobby_{n}", hobby, scope="user", user_id=ada.pk)
    service.set_fact("favourite_food", "steak", scope="user", user_id=ada.pk)
    for n, chore in enumerate(["fixed a flat bicycle tyre", "read a mystery novel"]):
        service.set_fact(f"chore_{n}", chore, scope="user", user_id=ada.pk)
    model = scripted(
        [proposal("diet", "vegetarian", words="I'm vegetarian now")],
        [{"proposal": 0, "action": "delete", "key": "favourite_food", "reason": "no longer true"}],
    )
    report = service.observe(messages, user_id=ada.pk, chat_model=model, episode_id=episode.pk)
    if service.recall_mode() == "hybrid":
        assert report.ok, report.as_dict()
        assert not Fact.objects.filter(key="favourite_food").exists()
    else:
        assert "not among the stored facts" in report.errors[0]
        assert Fact.objects.get(key="favourite_food").value == "steak"


def test_a_failing_model_writes_nothing_and_is_reported(service, ada, turn):
    episode, messages = turn
    service.set_fact("tea", "green", scope="user", user_id=ada.pk)
    before = snapshot()
    report = service.observe(messages, user_id=ada.pk, chat_model=BrokenModel(messages=iter([])), episode_id=episode.pk)
    assert not report.ok and report.decisions == []
    assert "ConnectionError" in report.errors[0] and "hung up" in report.errors[0]
    assert snapshot() == before


@pytest.mark.parametrize(
    "answers",
    [
        # A proposal without its key.
        [call("ProposedFacts", {"facts": [{"value": "vegetarian"}]})],
        # An action outside add / update / delete / none.
        [
            call("ProposedFacts", {"facts": [proposal("diet", "vegetarian")]}),
            call("Decisions", {"decisions": [{"proposal": 0, "action": "explode"}]}),
        ],
        # A decision about a proposal that does not exist (the valid one is not applied either).
        [
            call("ProposedFacts", {"facts": [proposal("diet", "vegetarian")]}),
            call("Decisions", {"decisions": [{"proposal": 0, "action": "add"}, {"proposal": 3, "action": "add"}]}),
        ],
        # No structured answer at all.
        [AIMessage(content="I think she is vegetarian.")],
    ],
    ids=["missing-key", "unknown-action", "unknown-proposal", "no-tool-call"],
)
def test_malformed_output_writes_nothing_and_is_reported(service, ada, turn, answers):
    episode, messages = turn
    service.set_fact("tea", "green", scope="user", user_id=ada.pk)
    before = snapshot()
    report = service.observe(
        messages, user_id=ada.pk, chat_model=ToolCallingFake(messages=iter(answers)), episode_id=episode.pk
    )
    assert not report.ok and report.decisions == [] and len(report.errors) == 1
    assert report.errors[0].startswith(("ProposedFacts", "Decisions"))
    assert snapshot() == before


def test_a_write_the_service_refuses_writes_nothing_of_the_turn(service, ada, turn):
    episode, messages = turn
    service.set_fact("favourite_food", "steak", scope="user", user_id=ada.pk)
    before = snapshot()
    model = scripted(
        [proposal("city", "Lisbon", message=0), proposal("", "vegetarian: no steak")],
        [
            {"proposal": 0, "action": "add"},
            {"proposal": 1, "action": "delete", "key": "favourite_food"},
            {"proposal": 1, "action": "add"},
        ],
    )
    report = service.observe(messages, user_id=ada.pk, chat_model=model, episode_id=episode.pk)
    assert not report.ok and report.decisions == []
    assert "decision add of proposal 1" in report.errors[0] and "InvalidMemoryArgument: key" in report.errors[0]
    assert snapshot() == before  # neither the add before it nor the delete stayed


ADD = [{"proposal": 0, "action": "add"}]


def test_an_unknown_episode_or_user_writes_nothing_and_is_named(service, ada, turn):
    _, messages = turn
    report = service.observe(messages, user_id=ada.pk, chat_model=scripted([proposal("a", "b")], ADD), episode_id=99999)
    assert "source_episode_id" in report.errors[0] and "99999" in report.errors[0]
    report = service.observe(messages, user_id=99999, chat_model=scripted([proposal("a", "b")], ADD))
    assert "user_id" in report.errors[0]
    assert not Fact.objects.exists()


def test_without_a_chat_model_the_rules_propose_and_the_key_decides(service, ada):
    report = service.observe([{"role": "user", "content": "my favourite colour is green"}], user_id=ada.pk)
    assert report.extractor == "rules" and report.model_calls == 0
    assert [(d["action"], d["key"]) for d in report.decisions] == [("add", "favourite_colour")]
    report = service.observe([{"role": "user", "content": "my favourite colour is blue"}], user_id=ada.pk)
    assert [(d["action"], d["write"]) for d in report.decisions] == [("update", "updated")]
    report = service.observe([{"role": "user", "content": "my favourite colour is blue"}], user_id=ada.pk)
    assert [d["action"] for d in report.decisions] == ["none"]
    assert Fact.objects.get(key="favourite_colour").value == "blue"


def test_bad_arguments_are_refused_before_the_model_is_asked(service, ada):
    model = BrokenModel(messages=iter([]))
    with pytest.raises(InvalidMemoryArgument, match="messages"):
        service.observe([], user_id=ada.pk, chat_model=model)
    with pytest.raises(InvalidMemoryArgument, match="episode_id"):
        service.observe(["hi"], user_id=ada.pk, chat_model=model, episode_id="twelve")
    with pytest.raises(InvalidMemoryArgument, match="user_id"):
        service.observe(["hi"], user_id=-1, chat_model=model)


# ------------------------------------------------------------- the remember node's extract mode

CTX = BuildContext(workflow_id=1, workflow_slug="helper", node_id="n")


def remember_state(user):
    return {
        "trigger": {"type": "chat", "payload": {}},
        "user": {"id": user.pk, "channel": "chat", "display_name": "Ada", "canonical_id": "chat:ada"},
        "messages": [HumanMessage("I'm vegetarian now")],
        "reply": "Noted!",
        "thread_id": f"{user.pk}:direct:1",
        "facts_to_remember": [],
    }


def chat_model_setting(settings, model_class, answers):
    settings.WORKFLOWS = {
        **settings.WORKFLOWS,
        "CHAT_MODEL": {"class": f"{__name__}.{model_class}", "kwargs": {"messages": iter(answers)}},
    }


def test_the_extract_mode_observes_the_turn_after_recording_it(settings, ada):
    chat_model_setting(
        settings,
        "ToolCallingFake",
        [
            call("ProposedFacts", {"facts": [proposal("diet", "vegetarian", words="I'm vegetarian now")]}),
            call("Decisions", {"decisions": [{"proposal": 0, "action": "add", "reason": "new"}]}),
        ],
    )
    result = build_remember({"mode": "extract"}, CTX)(remember_state(ada))
    assert result["memory_errors"] == []
    diet = Fact.objects.get(key="diet")
    assert diet.source_episode_id == result["episode_id"] and diet.user_id == ada.pk
    assert {"kind": "fact", "action": "created", "id": diet.pk, "key": "diet", "decision": "add", "reason": "new"} in (
        result["memory_writes"]
    )


def test_a_failing_model_in_extract_mode_leaves_the_turn_recorded_and_reports_it(settings, ada):
    chat_model_setting(settings, "BrokenModel", [])
    result = build_remember({"mode": "extract"}, CTX)(remember_state(ada))
    assert result["episode_id"] is not None  # the turn is kept
    [error] = result["memory_errors"]
    assert error["operation"] == "observe" and "ConnectionError" in error["error"]
    assert not Fact.objects.exists()


def test_the_key_value_mode_asks_no_model(settings, ada):
    chat_model_setting(settings, "BrokenModel", [])
    result = build_remember({}, CTX)(remember_state(ada))
    assert result["memory_errors"] == []


def test_the_extract_mode_without_a_chat_model_keeps_the_rule_based_facts(ada):
    """No chat model configured (the offline responder): the facts it read ("my X is Y") are stored as before."""
    state = {**remember_state(ada), "facts_to_remember": [{"key": "diet", "value": "vegetarian"}]}
    result = build_remember({"mode": "extract"}, CTX)(state)
    assert result["memory_errors"] == []
    assert [(r["key"], r["action"]) for r in result["remembered"]] == [("diet", "created")]
    assert Fact.objects.get(key="diet").source_episode_id == result["episode_id"]
