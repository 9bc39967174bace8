"""Consolidation: episodes become facts with provenance, by the built-in rules or a LangChain chat model."""

import json

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.messages import AIMessage

from memory.exceptions import ConsolidationFailed
from memory.learning.consolidation import LLMExtractor, RuleExtractor
from memory.models import ConsolidationRun, Episode, Fact
from memory.service import MemoryService

pytestmark = pytest.mark.django_db

AGENT = "support-bot"


@pytest.fixture
def finished_episode(service, user_factory):
    """finished_episode(*messages, user=..., summary=...) -> a completed episode holding those messages."""

    def make(*messages, user=None, agent_id=AGENT, summary="", session_id=""):
        episode = service.start_episode(agent_id=agent_id, user_id=user.pk if user else None, session_id=session_id)
        for role, content in messages:
            service.add_message(episode.pk, role, content)
        return service.complete_episode(episode.pk, success=True, summary=summary)

    return make


def facts_of(episode):
    return {f.key: f for f in Fact.objects.filter(source_episode=episode)}


# ------------------------------------------------------------------ built-in rules


def test_rules_turn_statements_and_decisions_into_user_facts(service, user_factory, finished_episode):
    ada = user_factory("ada")
    episode = finished_episode(
        ("user", "Hi! My favourite colour is green. My sister is Grace."),
        ("assistant", "Noted."),
        ("user", "Please remember that the deploy window is Friday afternoon."),
        ("assistant", "We decided to use PostgreSQL for the reports."),
        user=ada,
    )
    report = MemoryService().consolidate(extractor=RuleExtractor())
    assert report.ok, report.as_dict()
    assert report.processed == [episode.pk]
    facts = facts_of(episode)
    assert {k: f.value for k, f in facts.items()} == {
        "favourite_colour": "green",
        "sister": "Grace",
        "deploy_window": "Friday afternoon",
        "decision_use_postgresql_for_the_reports": "We decided to use PostgreSQL for the reports",
    }
    assert facts["favourite_colour"].fact_type == "user_preference"
    assert facts["sister"].fact_type == "relationship"
    for fact in facts.values():
        assert fact.scope == "user" and fact.user_id == ada.pk
        assert fact.provenance == "consolidation"
    assert service.get_fact("favourite_colour", agent_id=AGENT, user_id=ada.pk).value == "green"
    assert Episode.objects.get(pk=episode.pk).processed_for_facts is True


def test_rules_ignore_the_assistant_talking_about_itself_and_chit_chat(service, finished_episode):
    episode = finished_episode(
        ("user", "My question is whether this works."),
        ("assistant", "My name is Bot and my favourite colour is blue."),
    )
    report = MemoryService().consolidate(extractor=RuleExtractor())
    assert report.ok
    assert facts_of(episode) == {}
    assert Episode.objects.get(pk=episode.pk).processed_for_facts  # read, nothing durable in it


def test_without_a_user_facts_go_to_the_agent(service, finished_episode):
    finished_episode(("user", "Remember that the office wifi is engram-guest."), user=None)
    MemoryService().consolidate(extractor=RuleExtractor())
    fact = Fact.objects.get(key="office_wifi")
    assert (fact.scope, fact.agent_id, fact.value) == ("agent", AGENT, "engram-guest")


def test_a_repeated_fact_confirms_instead_of_duplicating(service, user_factory, finished_episode):
    ada = user_factory("ada")
    finished_episode(("user", "My timezone is UTC."), user=ada)
    finished_episode(("user", "As I said, my timezone is UTC."), user=ada)
    report = MemoryService().consolidate(extractor=RuleExtractor())
    assert report.actions == {"created": 1, "confirmed": 1}
    fact = Fact.objects.get(key="timezone")
    assert fact.times_confirmed == 1
    assert Fact.objects.filter(key="timezone").count() == 1


def test_oldest_first_at_most_n_per_run_and_only_finished_episodes(service, finished_episode, settings):
    settings.MEMORY = {**settings.MEMORY, "CONSOLIDATION": {"MAX_EPISODES_PER_RUN": 2}}
    first, second, third = (finished_episode(("user", f"My code {i} is {i}.")) for i in range(3))
    running = service.start_episode(agent_id=AGENT)  # not finished: its conversation may still grow
    report = MemoryService().consolidate()  # the default extractor is the built-in rules
    assert report.extractor == "rules"
    assert report.processed == [first.pk, second.pk]
    report = MemoryService().consolidate()
    assert report.processed == [third.pk]
    assert MemoryService().consolidate().episodes_seen == 0
    assert not Episode.objects.get(pk=running.pk).processed_for_facts


def test_each_run_is_recorded(service, finished_episode):
    finished_episode(("user", "My city is Porto."))
    report = MemoryService().consolidate()
    run = service.last_consolidation()
    assert run.pk == report.run_id
    assert (run.episodes_processed, run.facts_created, run.ok) == (1, 1, True)


def test_service_consolidate_is_the_same_run(service, finished_episode):
    episode = finished_episode(("user", "My city is Porto."))
    assert service.consolidate(agent_id=AGENT).processed == [episode.pk]
    assert service.consolidate(agent_id="another-agent").episodes_seen == 0


# ------------------------------------------------------------------ LLM extractor


def test_llm_extractor_with_a_json_answering_model(service, user_factory, finished_episode):
    ada = user_factory("ada")
    episode = finished_episode(
        ("user", "I moved to Lisbon last month, and I'd rather get answers in Portuguese."), user=ada
    )
    answer = {
        "facts": [
            {"key": "home_city", "value": "Lisbon", "fact_type": "user_preference", "confidence": 0.9, "scope": "user"},
            {
                "key": "reply_language",
                "value": "pt",
                "fact_type": "user_preference",
                "confidence": 0.7,
                "scope": "user",
            },
            {
                "key": "lisbon_is_in",
                "value": "Portugal",
                "fact_type": "world_knowledge",
                "confidence": 1.0,
                "scope": "global",
            },
        ]
    }
    model = FakeListChatModel(responses=["```json\n" + json.dumps(answer) + "\n```"])
    report = MemoryService().consolidate(extractor=LLMExtractor(model))
    assert report.ok, report.as_dict()
    assert report.extractor == "llm:FakeListChatModel"
    facts = facts_of(episode)
    assert facts["home_city"].value == "Lisbon" and facts["home_city"].user_id == ada.pk
    assert facts["home_city"].confidence == pytest.approx(0.9)
    assert facts["lisbon_is_in"].scope == "global"
    assert all(f.provenance == "consolidation" for f in facts.values())


class ToolCallingFakeChatModel(GenericFakeChatModel):
    """LangChain's generic fake model answering with tool calls, as models with structured output do."""

    def bind_tools(self, tools, **kwargs):
        return self


def test_llm_extractor_with_structured_output(service, user_factory, finished_episode):
    ada = user_factory("ada")
    episode = finished_episode(("user", "call me Ada please"), user=ada)
    call = {
        "name": "ExtractedFacts",
        "id": "call-1",
        "args": {
            "facts": [
                {
                    "key": "preferred_name",
                    "value": "Ada",
                    "fact_type": "user_preference",
                    "confidence": 0.95,
                    "scope": "user",
                },
            ]
        },
    }
    model = ToolCallingFakeChatModel(messages=iter([AIMessage(content="", tool_calls=[call])]))
    extractor = LLMExtractor(model)
    assert extractor.structured is not None
    report = MemoryService().consolidate(extractor=extractor)
    assert report.ok, report.as_dict()
    assert facts_of(episode)["preferred_name"].value == "Ada"


def test_a_scope_without_its_owner_falls_back_to_the_episodes_owner(service, finished_episode):
    finished_episode(("user", "hi"))  # no user, no session
    answer = {
        "facts": [{"key": "likes", "value": "tea", "fact_type": "user_preference", "confidence": 0.5, "scope": "user"}]
    }
    MemoryService().consolidate(extractor=LLMExtractor(FakeListChatModel(responses=[json.dumps(answer)])))
    fact = Fact.objects.get(key="likes")
    assert (fact.scope, fact.agent_id) == ("agent", AGENT)


def test_the_llm_extractor_comes_from_settings(service, finished_episode, settings):
    settings.MEMORY = {
        **settings.MEMORY,
        "CONSOLIDATION": {
            "EXTRACTOR": "memory.consolidation.LLMExtractor",
            "MODEL": "langchain_core.language_models.fake_chat_models.FakeListChatModel",
            "MODEL_KWARGS": {"responses": ['{"facts": []}']},
        },
    }
    episode = finished_episode(("user", "nothing to keep"))
    report = MemoryService().consolidate()
    assert report.ok and report.processed == [episode.pk]
    assert report.extractor == "llm:FakeListChatModel"


# ------------------------------------------------------------------ failures


class FailingChatModel(FakeListChatModel):
    """LangChain's fake list model, failing the way an unreachable provider does."""

    responses: list = ["never"]

    def _call(self, *args, **kwargs):
        raise ConnectionError("model is down")


def test_a_failing_model_marks_nothing_processed_and_does_not_raise(service, finished_episode, caplog):
    episodes = [finished_episode(("user", f"My pin is {i}.")) for i in range(2)]
    report = MemoryService().consolidate(extractor=LLMExtractor(FailingChatModel()))
    assert not report.ok
    assert report.processed == []
    assert set(report.failed) == {e.pk for e in episodes}
    assert "model is down" in report.failed[episodes[0].pk]
    assert Episode.objects.filter(processed_for_facts=True).count() == 0
    assert Fact.objects.count() == 0
    assert "extractor" in caplog.text and "model is down" in caplog.text
    run = ConsolidationRun.objects.get(pk=report.run_id)
    assert (run.ok, run.episodes_failed) == (False, 2)


def test_raise_errors_raises_with_the_report(service, finished_episode):
    finished_episode(("user", "My pin is 1."))
    with pytest.raises(ConsolidationFailed) as info:
        MemoryService().consolidate(extractor=LLMExtractor(FailingChatModel()), raise_errors=True)
    assert "model is down" in str(info.value)
    assert info.value.report.processed == []


@pytest.mark.parametrize(
    "answer, message",
    [
        ("I found nothing worth keeping", "did not answer with JSON"),
        ('{"facts": [{"key": "k", "value": "v", "fact_type": "gossip", "confidence": 0.5}]}', "fact_type"),
        ('{"facts": [{"key": "k", "value": "v", "fact_type": "correction", "confidence": 7}]}', "confidence"),
    ],
)
def test_an_answer_off_the_schema_fails_that_episode(service, finished_episode, answer, message):
    episode = finished_episode(("user", "My pin is 1."))
    report = MemoryService().consolidate(extractor=LLMExtractor(FakeListChatModel(responses=[answer])))
    assert report.processed == [] and message in report.failed[episode.pk]
    assert not Episode.objects.get(pk=episode.pk).processed_for_facts


def test_a_fact_that_cannot_be_stored_rolls_back_the_whole_episode(service, finished_episode):
    episode = finished_episode(("user", "two facts"))
    answer = {
        "facts": [
            {"key": "good", "value": "kept?", "fact_type": "world_knowledge", "confidence": 0.5, "scope": "agent"},
            {"key": "  ", "value": "blank key", "fact_type": "world_knowledge", "confidence": 0.5, "scope": "agent"},
        ]
    }
    report = MemoryService().consolidate(extractor=LLMExtractor(FakeListChatModel(responses=[json.dumps(answer)])))
    assert "key: must not be empty" in report.failed[episode.pk]
    assert Fact.objects.count() == 0  # the good fact was rolled back with the bad one
    assert not Episode.objects.get(pk=episode.pk).processed_for_facts
    # fixed on the next run: the episode is still there to consolidate
    assert MemoryService().consolidate(extractor=RuleExtractor()).processed == [episode.pk]


def test_a_missing_model_setting_is_reported_not_raised(service, finished_episode, settings):
    settings.MEMORY = {**settings.MEMORY, "CONSOLIDATION": {"EXTRACTOR": "memory.consolidation.LLMExtractor"}}
    finished_episode(("user", "My pin is 1."))
    report = MemoryService().consolidate()
    assert not report.ok and "CONSOLIDATION['MODEL'] is not set" in report.errors[0]
    assert Episode.objects.filter(processed_for_facts=True).count() == 0


def test_an_episode_consolidated_meanwhile_is_not_stored_twice(service, finished_episode):
    episode = finished_episode(("user", "My pin is 1."))
    writes = service.store_consolidated_facts(
        episode.pk, [{"key": "pin", "value": "1", "scope": "agent", "agent_id": AGENT}]
    )
    assert [w.action for w in writes] == ["created"]
    again = service.store_consolidated_facts(
        episode.pk, [{"key": "pin", "value": "1", "scope": "agent", "agent_id": AGENT}]
    )
    assert again is None
    assert Fact.objects.get(key="pin").times_confirmed == 0  # the second attempt was rolled back


# ------------------------------------------------------------------ hook for workflows


def test_consolidate_after_run_follows_the_setting(service, finished_episode, settings):
    episode = finished_episode(("user", "My city is Porto."))
    assert MemoryService().consolidate_after_run(episode.pk) is None
    settings.MEMORY = {**settings.MEMORY, "CONSOLIDATION": {"AFTER_EACH_RUN": True}}
    other = finished_episode(("user", "My city is Braga."))
    report = MemoryService().consolidate_after_run(episode.pk)
    assert report.processed == [episode.pk]
    assert not Episode.objects.get(pk=other.pk).processed_for_facts


def test_consolidation_does_not_replay_what_the_runs_already_stored(demo_workflow):
    """Three runs said COBOL, then Fortran, then Ada, and each run's remember node stored it. A later
    `memory consolidate` must not walk the fact back through the older values, nor lower its confidence."""
    from workflow_helpers import talk

    for language in ("COBOL", "Fortran", "Ada"):
        talk(demo_workflow, "lin", f"my language is {language}")
    fact = Fact.objects.get(key="language")
    assert (fact.value, fact.confidence) == ("Ada", 0.8)
    report = MemoryService().consolidate(extractor=RuleExtractor())
    assert len(report.processed) == 3 and report.actions == {"kept_newer": 3}
    fact.refresh_from_db()
    assert (fact.value, fact.confidence, fact.times_contradicted) == ("Ada", 0.8, 2)  # the runs' own two changes
