"""Engram over MCP: `recall`, `remember` and `forget` for one agent (and optionally one memory user).

    python manage.py memory mcp --agent support-bot [--user 12 | --user telegram:4711]   # stdio
    python manage.py memory mcp --http [--host 127.0.0.1 --port 8765]                     # streamable HTTP

Who is calling is never a tool argument (the peers' servers leak across tenants exactly there): over
stdio it is the command's --agent and --user; over HTTP it is the bearer token's entry in
MEMORY["MCP_TOKENS"] ({token: {"agent": ..., "user": <memory user id or None>, "workspace": <workspace id,
optional: the default workspace>}}), checked by the SDK's
own bearer-token middleware, which answers 401 to a missing or unknown token before any tool runs.
The tools take only what to look up, store or delete (an extra argument such as `user_id` is dropped
by the SDK's argument model, so it cannot change whom a call acts for). Recalled text comes back
inside the same untrusted-hints block Engram's agents get.

Each tool call runs on a worker thread of the event loop's pool (memory.asynchronous.off_the_loop),
so calls from several clients run side by side (a recall waiting for the embedding model, or a write
waiting for a lock, holds up no other call) and the loop never waits on the database or the model.
"""

import hmac
import json
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from .asynchronous import off_the_loop
from .conf import memory_settings
from .exceptions import InvalidMemoryArgument, MemoryServiceError
from .hints import hints_block, scrub
from .models import DEFAULT_WORKSPACE_ID, FactType, Scope, in_workspace
from .rules.validation import check_int, check_user_id, clean_text, importance_as_confidence
from .service import MemoryService

# Most hits one recall call may ask for.
MAX_RECALL_LIMIT = 50
# A bearer token shorter than this is refused in MEMORY["MCP_TOKENS"] (guessable).
MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True)
class Caller:
    """Whom the tools act for."""

    agent_id: str
    user_id: int | None = None
    # Every call works in this workspace (memory.models.workspaces): it sees and writes nothing of another.
    workspace_id: int = DEFAULT_WORKSPACE_ID


def configured_callers(tokens=None):
    """MEMORY["MCP_TOKENS"] (or `tokens`) checked, as {token: Caller}.

    Raises ImproperlyConfigured naming the entry by its position, never by the token itself.
    """
    tokens = memory_settings.MCP_TOKENS if tokens is None else tokens
    if not isinstance(tokens, dict):
        raise ImproperlyConfigured(f"MEMORY['MCP_TOKENS'] must be a dict of token: caller, got {type(tokens).__name__}")
    callers = {}
    for position, (token, entry) in enumerate(tokens.items(), 1):
        where = f"MEMORY['MCP_TOKENS'] entry {position}"
        if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH or token != token.strip() or " " in token:
            raise ImproperlyConfigured(
                f"{where}: the token must be a string of at least {MIN_TOKEN_LENGTH} characters without spaces"
            )
        if not isinstance(entry, dict) or "agent" not in entry or set(entry) - {"agent", "user", "workspace"}:
            raise ImproperlyConfigured(
                f'{where}: must be {{"agent": <agent id>, "user": <memory user id or None>, "workspace": <workspace id>}}'
            )
        try:
            caller = Caller(
                agent_id=clean_text("agent", entry["agent"], max_length=128),
                user_id=check_user_id("user", entry.get("user"), required=False),
                workspace_id=check_int("workspace", entry.get("workspace", DEFAULT_WORKSPACE_ID), minimum=1),
            )
        except InvalidMemoryArgument as exc:
            raise ImproperlyConfigured(f"{where}: {exc}") from None
        callers[token] = caller
    return callers


class ConfiguredTokens:
    """The SDK's TokenVerifier over MEMORY["MCP_TOKENS"]: a known token is an access token (its
    client id is the entry's position; the token itself is never logged or echoed)."""

    async def verify_token(self, token):
        found = None
        for position, known in enumerate(configured_callers(), 1):
            if hmac.compare_digest(token.encode("utf-8", "replace"), known.encode()):  # compare every one
                found = position
        return None if found is None else AccessToken(token=token, client_id=f"mcp-token-{found}", scopes=[])


def token_caller():
    """The Caller of the HTTP request being served, from its verified token."""
    access = get_access_token()
    caller = None if access is None else configured_callers().get(access.token)
    if caller is None:  # the bearer middleware lets no request through without a known token
        raise ToolError("this request carries no configured token")
    return caller


def build_server(caller, *, http_url=None):
    """An MCPServer whose tools act for `caller()` (called per tool call). With `http_url` (the
    server's own address) it requires a bearer token from MEMORY["MCP_TOKENS"]."""
    auth = {}
    if http_url:
        auth = {
            "token_verifier": ConfiguredTokens(),
            # Static tokens of this server alone: there is no audience to check.
            "auth": AuthSettings(
                issuer_url=http_url, resource_server_url=f"{http_url}/mcp", validate_token_resource=False
            ),
        }
    server = MCPServer("engram", instructions="Long-term memory: recall, remember and forget.", **auth)
    service = MemoryService()

    def person(who):
        """The caller's memory user as it stands now (a merged user's survivor), or None."""
        return None if who.user_id is None else service.resolve_user(who.user_id).pk

    @server.tool()
    async def recall(
        query: str, limit: int = 10, memory_types: list[str] | None = None, valid_at: str = "", as_of: str = ""
    ) -> str:
        """Look up long-term memory: facts, earlier conversations and procedures relevant to `query`.

        Each hit has its kind and id (what `forget` takes), its text and a score. `limit`: 1 to 50.
        `memory_types`: any of facts, episodes, procedures (default: all three).
        `valid_at` (ISO 8601 date or datetime): facts as they held in the world then ("where did she
        live in 2024?"); `as_of`: what memory said at that time. Without them: what holds now.
        """
        who = caller()

        def run():
            checked = check_int("limit", limit, minimum=1, maximum=MAX_RECALL_LIMIT)
            hits = service.recall(
                query,
                agent_id=who.agent_id,
                user_id=person(who),
                limit=checked,
                **({} if memory_types is None else {"types": memory_types}),  # None: recall's default, all
                valid_at=valid_at.strip() or None,
                as_of=as_of.strip() or None,
            )
            return [{"kind": h.kind, "id": h.id, "text": scrub(h.text), "score": round(h.score, 3)} for h in hits]

        return await _answer(who, run, render_hits)

    @server.tool()
    async def remember(
        key: str,
        value: str,
        fact_type: str = FactType.WORLD_KNOWLEDGE,
        tags: list[str] | None = None,
        importance: float | None = None,
        team: str = "",
        valid_from: str = "",
        valid_to: str = "",
    ) -> str:
        """Store the fact `key` = `value` (for the user this server acts for, if any; else for the agent).

        `fact_type`: user_preference, world_knowledge, self_knowledge, correction or relationship.
        `tags`: a few labels; `importance`: 0.0 to 1.0 (stored as the fact's confidence, which
        recall's ranking reads). `team`: the name of a team this agent belongs to, to share the
        fact with every agent of that team instead (not with a user).
        The same key again confirms (same value) or replaces (another value) the stored fact.
        `valid_from` / `valid_to` (ISO 8601, optional): when the value holds in the world; a new
        value ends the old one's time at its valid_from (now when not given), and the old value
        stays readable for its time (recall's valid_at).
        """
        who = caller()

        def run():
            if team.strip():
                owner = {"scope": Scope.TEAM, "team": team.strip()}
            else:
                user_id = person(who)
                owner = {"scope": Scope.USER, "user_id": user_id} if user_id is not None else {"scope": Scope.AGENT}
            return service.set_fact(
                key,
                value,
                agent_id=who.agent_id,
                fact_type=fact_type,
                confidence=importance_as_confidence(importance),
                tags=tags,
                valid_from=valid_from.strip() or None,
                valid_to=valid_to.strip() or None,
                **owner,
            )

        return await _answer(who, run, lambda write: f"{write.action}: fact {write.fact.pk} ({write.fact.key})")

    @server.tool()
    async def forget(kind: str, id: int) -> str:
        """Delete one memory you can see: `kind` is fact, episode or procedure, `id` its id from recall."""
        who = caller()

        def run():
            return service.forget_visible(kind, id, agent_id=who.agent_id, user_id=person(who), actor="mcp")

        return await _answer(who, run, lambda _: f"forgot {kind} {id}")

    return server


def render_hits(hits):
    """Recall hits for a model: one JSON list inside the untrusted-hints block."""
    return hints_block(json.dumps(hits, ensure_ascii=False))


async def _answer(who, run, describe):
    """The tool's text: `describe(result)`, or the memory error (a bad argument, a refused id) as an
    error the SDK returns to the client with isError set; nothing was written then."""

    def in_callers_workspace():
        with in_workspace(who.workspace_id):
            return run()

    try:
        result = await off_the_loop(in_callers_workspace)()
    except MemoryServiceError as exc:
        raise ToolError(str(exc)) from None
    return describe(result)
