"""Valid time through the agent's tools and the MCP server: valid_from / valid_to on remember,
valid_at / as_of on recall, passed through to MemoryService; a bad date names the field."""

import datetime

import pytest
from django.utils import timezone
from test_agent_tools import run_agent
from test_mcp import hits_of, tools_for

from memory.mcp_server import Caller
from memory.models import Fact, FactHistory
from workflows import langgraph as engram

pytestmark = pytest.mark.django_db(transaction=True)  # tools run in worker threads

UTC = datetime.UTC


def test_the_agents_tools_store_and_read_valid_time(service, user_factory, keyword_only):
    ada = user_factory("ada")
    replies = run_agent(
        engram.memory_tools(agent_id="bot", user_id=ada.pk, names=("recall", "remember")),
        ("remember", {"key": "city", "value": "Paris", "valid_from": "2019-03-01"}),
        ("remember", {"key": "city", "value": "Berlin", "valid_from": "2025-06-01"}),
        ("recall", {"key": "city"}),
        ("recall", {"key": "city", "valid_at": "2024-07-01"}),
        ("recall", {"query": "city", "valid_at": "2024-07-01"}),
        ("remember", {"key": "city", "value": "Rome", "valid_from": "2026-01-01", "valid_to": "2025-01-01"}),
        ("recall", {"key": "city", "valid_at": "in the spring"}),
    )
    assert replies[0] == ("Remembered city = Paris for this user (created, valid 2019-03-01 to now).", "success")
    assert replies[1] == ("Remembered city = Berlin for this user (updated, valid 2025-06-01 to now).", "success")
    assert replies[2][0].startswith("city = Berlin (user, confidence")
    assert (
        replies[3][0].startswith("city = Paris (user, confidence") and "valid 2019-03-01 to 2025-06-01" in replies[3][0]
    )
    assert replies[4] == ("city = Paris (user, valid 2019-03-01 to 2025-06-01)", "success")
    assert replies[5][1] == "error" and "valid_to: must be after valid_from" in replies[5][0]
    assert replies[6][1] == "error" and "valid_at: must be an ISO 8601" in replies[6][0]
    assert Fact.objects.get(key="city").value == "Berlin"


def test_mcp_passes_valid_time_through(service, user_factory, keyword_only):
    ada = user_factory("ada")

    async def work(call):
        return [
            await call("remember", key="city", value="Paris", valid_from="2019-03-01"),
            await call("remember", key="city", value="Berlin", valid_from="2025-06-01T00:00:00Z"),
            await call("recall", query="city"),
            await call("recall", query="city", valid_at="2024-07-01"),
            await call("recall", query="city", as_of="2001-01-01"),
            await call("remember", key="city", value="Rome", valid_to="last week"),
            await call("recall", query="city", valid_at="2024-13-01"),
        ]

    created, moved, now, then, before_any, bad_write, bad_read = tools_for(Caller("desk", ada.pk), work)
    assert not created[0] and created[1].startswith("created: fact")
    assert not moved[0] and moved[1].startswith("updated: fact")
    assert [h["text"] for h in hits_of(now[1])] == ["city: Berlin"]
    assert [h["text"] for h in hits_of(then[1])] == ["city: Paris"]
    assert hits_of(before_any[1]) == []
    assert bad_write[0] and "valid_to: must be an ISO 8601" in bad_write[1]
    assert bad_read[0] and "valid_at: must be an ISO 8601" in bad_read[1]
    fact = Fact.objects.get(key="city")
    assert (fact.value, fact.valid_from) == ("Berlin", datetime.datetime(2025, 6, 1, tzinfo=UTC))
    assert FactHistory.objects.count() == 2 and fact.updated_at < timezone.now()
