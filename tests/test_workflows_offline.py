"""The offline responder: facts from plain statements, answers from recalled memory, always labelled."""

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from workflows.graph.offline import LABEL, OfflineResponder, facts_in, reply_to


@pytest.mark.parametrize(
    "text, facts",
    [
        ("my name is Ada", [{"key": "name", "value": "Ada", "fact_type": "world_knowledge"}]),
        (
            "My favourite colour is green!",
            [{"key": "favourite_colour", "value": "green", "fact_type": "user_preference"}],
        ),
        (
            "Remember that my birthday is May 1.",
            [{"key": "birthday", "value": "May 1", "fact_type": "world_knowledge"}],
        ),
        (
            "please remember the office closes at 6",
            [{"key": "note_the_office_closes_at_6", "value": "the office closes at 6", "fact_type": "world_knowledge"}],
        ),
        (
            "my name is Ada and my city is Paris",
            [
                {"key": "name", "value": "Ada", "fact_type": "world_knowledge"},
                {"key": "city", "value": "Paris", "fact_type": "world_knowledge"},
            ],
        ),
        ("call me Ada", [{"key": "name", "value": "Ada", "fact_type": "world_knowledge"}]),
        ("what is my name?", []),
        ("hello there", []),
    ],
)
def test_facts_in_statements(text, facts):
    assert facts_in(text) == facts


MEMORIES = {
    "facts": [
        {"key": "name", "value": "Ada", "scope": "user", "matched": True},
        {"key": "favourite_colour", "value": "green", "scope": "user", "matched": False},
        {"key": "office_hours", "value": "9 to 5", "scope": "agent", "matched": False},
    ]
}


def test_answers_from_memory_and_is_labelled():
    assert reply_to("what is my name?", MEMORIES) == f"{LABEL} Your name is Ada."
    assert reply_to("What's my favourite colour?", MEMORIES) == f"{LABEL} Your favourite colour is green."
    assert "don't know your age" in reply_to("what is my age?", MEMORIES)
    about = reply_to("what do you know about me?", MEMORIES)
    assert "name: Ada" in about and "favourite colour: green" in about and "office" not in about
    assert reply_to("my name is Bob", {}) == f"{LABEL} Noted: your name is Bob."
    assert reply_to("hi", MEMORIES).startswith(f"{LABEL} Here is what I remember")


def test_only_the_users_own_facts_answer_questions_about_them():
    others = {"facts": [{"key": "name", "value": "Ada", "scope": "global", "matched": True}]}
    assert "Ada" not in reply_to("what is my name?", others)


def test_as_a_chat_model_it_answers_the_last_human_message():
    model = OfflineResponder(memories=MEMORIES)
    answer = model.invoke([SystemMessage("be nice"), HumanMessage("what is my name?")])
    assert answer.content == f"{LABEL} Your name is Ada."
    assert model.bind_tools([]) is model


@pytest.mark.parametrize(
    "text, fact_type",
    [
        ("my sister is Dana", "relationship"),
        ("my best friend is Sam", "relationship"),
        ("my brother's name is Leo", "relationship"),
        ("my favourite dog breed is the beagle", "user_preference"),
        ("my city is Porto", "world_knowledge"),
    ],
)
def test_fact_types_follow_what_was_said(text, fact_type):
    """One rule for the offline responder and consolidation: a relation named is a relationship."""
    from memory.learning.consolidation import RuleExtractor

    assert [f["fact_type"] for f in facts_in(text)] == [fact_type]
    episode = type("E", (), {"conversation": [{"role": "user", "content": text}], "summary": ""})()
    expected = (
        "user_preference" if fact_type == "world_knowledge" else fact_type
    )  # rules: "my X" defaults to the person's
    assert [f.fact_type for f in RuleExtractor(confidence=0.6).extract(episode)] == [expected]
