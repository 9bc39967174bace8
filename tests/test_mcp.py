"""The MCP server (memory/mcp_server.py) through the official SDK's own clients: stdio against a real
`manage.py memory mcp` process, streamable HTTP against a real uvicorn server with bearer tokens.

The caller's identity comes from the server's configuration or the token, never from tool arguments.
"""

import asyncio
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from conftest import database_url
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from memory.mcp_server import build_server, token_caller
from memory.models import Fact

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


def text_of(result):
    return "".join(part.text for part in result.content if getattr(part, "type", "") == "text")


async def call(session, tool, **arguments):
    result = await session.call_tool(tool, arguments)
    return result.is_error, text_of(result)


def test_stdio_remember_recall_forget_for_the_configured_person_only(service, user_factory, tmp_path):
    ada, bob = user_factory("ada"), user_factory("bob")
    bobs = service.set_fact("drink", "black coffee", scope="user", user_id=bob.pk).fact
    params = StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "memory", "mcp", "--agent", "desk", "--user", str(ada.pk)],
        cwd=str(REPO),
        env={**os.environ, "DATABASE_URL": database_url(), "ENGRAM_DATA_DIR": str(tmp_path)},
    )

    async def main():
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert set(tools) == {"recall", "remember", "forget"}
            for tool in tools.values():  # no argument can name whom the tool acts for
                assert not {"user", "user_id", "agent", "agent_id"} & set(tool.input_schema["properties"])
            error, text = await call(session, "remember", key="drink", value="green tea")
            assert not error and text.startswith("created: fact ") and text.endswith(" (drink)")
            error, hits = await call(session, "recall", query="drink")
            assert not error and "UNTRUSTED HINTS" in hits and "green tea" in hits and "coffee" not in hits
            # Naming another user in the arguments changes nothing: the call is refused, nothing leaks.
            error, text = await call(session, "recall", query="drink", user_id=bob.pk)
            assert error or "coffee" not in text
            # Bob's fact and an id that does not exist are refused alike.
            refused_bobs = await call(session, "forget", kind="fact", id=bobs.pk)
            refused_none = await call(session, "forget", kind="fact", id=bobs.pk + 1000)
            assert refused_bobs[0] and refused_none[0]
            assert refused_bobs[1].replace(str(bobs.pk), "N") == refused_none[1].replace(str(bobs.pk + 1000), "N")
            own = json.loads((await call(session, "recall", query="drink"))[1].split("\n", 1)[1])[0]
            assert await call(session, "forget", kind=own["kind"], id=own["id"]) == (
                False,
                f"forgot fact {own['id']}",
            )
            error, text = await call(session, "forget", kind="memo", id=1)
            assert error and text.endswith("kind: must be one of fact, episode, procedure; got 'memo'")

    asyncio.run(main())
    assert not Fact.objects.filter(user=ada).exists()
    assert Fact.objects.get(pk=bobs.pk).value == "black coffee"


@pytest.fixture
def http_server(settings, user_factory):
    """Engram's MCP app under a real uvicorn server on a free port, with two tokens."""
    ada = user_factory("ada")
    settings.MEMORY = {
        **settings.MEMORY,
        "MCP_TOKENS": {"tok-ada": {"agent": "desk", "user": ada.pk}, "tok-bot": {"agent": "desk"}},
    }
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    app = build_server(token_caller, http_url=url).streamable_http_app()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield url, ada
    server.should_exit = True
    thread.join(10)


def test_http_acts_for_the_tokens_caller_and_refuses_a_bad_token(http_server, service):
    url, ada = http_server

    async def session_for(token, work):
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as client:
            async with streamable_http_client(f"{url}/mcp", http_client=client) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    return await work(session)

    async def main():
        await session_for("tok-ada", lambda s: call(s, "remember", key="city", value="Oslo"))
        await session_for("tok-bot", lambda s: call(s, "remember", key="style", value="be brief"))
        ada_sees = await session_for("tok-ada", lambda s: call(s, "recall", query="city style"))
        bot_sees = await session_for("tok-bot", lambda s: call(s, "recall", query="city style"))
        return ada_sees, bot_sees

    ada_sees, bot_sees = asyncio.run(main())
    assert "Oslo" in ada_sees[1] and "be brief" in ada_sees[1]  # her fact, and her agent's
    assert "Oslo" not in bot_sees[1] and "be brief" in bot_sees[1]  # the agent alone never sees hers
    assert Fact.objects.get(key="city").user_id == ada.pk and Fact.objects.get(key="style").agent_id == "desk"
    before = Fact.objects.count()
    for headers in ({"Authorization": "Bearer wrong"}, {}):
        answer = httpx.post(
            f"{url}/mcp",
            headers={**headers, "Accept": "application/json, text/event-stream"},
            json={
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "remember", "arguments": {"key": "x", "value": "y"}},
            },
        )
        assert answer.status_code == 401
    assert Fact.objects.count() == before
