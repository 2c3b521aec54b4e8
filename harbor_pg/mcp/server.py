"""harbor-pg's memory over the Model Context Protocol (the official ``mcp`` SDK).

Tools: ``remember``, ``recall`` (with every ranking signal), ``context`` (the
per-turn build), ``forget``, ``history`` and, for an administrator, ``erase``.
Resources: ``harbor://memories/{scope}``, the caller's currently valid
memories.

Identity never comes from a tool's arguments. On stdio the server runs as
the one identity of its configuration; over streamable HTTP every request
carries a bearer token that the database maps to the identity it was issued
for (:class:`~harbor_pg.access_tokens.TokenStore`), and a request without a live
token is answered 401 before anything runs. Everything goes through the
facade (:class:`~harbor_pg.MemoryManager`) as that identity, so row-level
security applies to all of it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from harbor_pg.access_tokens import TokenStore
from harbor_pg.errors import MemoryError
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory

if TYPE_CHECKING:
    from harbor_pg.manager import MemoryManager

__all__ = ["Caller", "HarborTokenVerifier", "build_server", "serve_http", "serve_stdio"]

log = logging.getLogger("harbor_pg.mcp")

#: Scope of the bearer tokens this server accepts.
TOKEN_SCOPE = "harbor"
_INSTRUCTIONS = (
    "Long-term memory for the person or agent you are working for. Call `recall` before "
    "answering anything that may depend on what you were told earlier, `remember` when you "
    "learn a durable fact, preference or decision, and `context` at the start of a turn to get "
    "the recent conversation, its summary and the relevant memories in one call. Whose memory "
    "this is comes from the server's configuration or your access token, never from arguments."
)

WritableScope = Literal["user", "session", "project", "run"]
MemoryKind = Literal["fact", "preference", "decision", "episode"]
SensitivityLevel = Literal["none", "low", "pii", "sensitive"]


@dataclass(frozen=True)
class Caller:
    """Who a request acts as: the identity and whether it may erase."""

    owner: MemoryOwner
    is_admin: bool = False


class HarborTokenVerifier:
    """The SDK's bearer-token check, answered by ``harbor.access_tokens``.

    A token is looked up on every HTTP request (so a revoked one stops working at
    once); the identity it stands for travels in the SDK's access-token claims.
    """

    def __init__(self, tokens: TokenStore) -> None:
        self.tokens = tokens

    async def verify_token(self, token: str) -> Any:
        """The SDK's ``AccessToken`` for a live harbor token, else None (401)."""
        try:
            found = await self.tokens.authenticate(token)
        except MemoryError as exc:
            log.warning("token check failed, the request is refused: %s", exc)
            return None
        if found is None:
            return None
        owner = found.owner
        return AccessToken(
            token=token,
            client_id=found.id,
            subject=found.id,
            scopes=[TOKEN_SCOPE],
            expires_at=int(found.expires_at.timestamp()) if found.expires_at else None,
            claims={
                "harbor_identity": owner.model_dump(),
                "harbor_admin": found.is_admin,
            },
        )


def _resource_scopes(scope: str) -> list[MemoryScope]:
    """A resource's ``{scope}``: user, session or project, or all three (``all``)."""
    allowed = ("project", "session", "user")
    if scope != "all" and scope not in allowed:
        raise ResourceError(f"unknown scope {scope!r}: use all, user, session or project")
    return [MemoryScope(s) for s in (allowed if scope == "all" else (scope,))]


def _memory_view(memory: Memory) -> dict[str, Any]:
    return {
        "id": memory.id,
        "content": memory.content,
        "scope": memory.scope.value,
        "memory_type": memory.memory_type.value,
        "importance": memory.importance,
        "sensitivity": memory.sensitivity.value,
        "entity_ids": list(memory.entity_ids),
        "source": memory.source,
        "valid_from": memory.valid_from.isoformat() if memory.valid_from else None,
        "invalid_at": memory.invalid_at.isoformat() if memory.invalid_at else None,
        "superseded_by": memory.superseded_by,
    }


def build_server(
    manager: MemoryManager,
    *,
    caller: Caller | None = None,
    tokens: TokenStore | None = None,
    base_url: str = "http://127.0.0.1:8765",
) -> MCPServer[Any]:
    """An ``MCPServer`` whose tools act on ``manager``.

    Pass ``caller`` for stdio (every request acts as it), or ``tokens`` for
    streamable HTTP (every request acts as its bearer token's identity;
    ``base_url`` is where the server is reached, for the SDK's resource
    metadata).
    """
    if (caller is None) == (tokens is None):
        raise ValueError("build_server needs exactly one of caller= (stdio) or tokens= (HTTP)")
    if tokens is not None:
        server: MCPServer[Any] = MCPServer(
            "harbor-pg",
            instructions=_INSTRUCTIONS,
            token_verifier=HarborTokenVerifier(tokens),
            auth=AuthSettings(
                issuer_url=base_url,  # type: ignore[arg-type]
                resource_server_url=base_url,  # type: ignore[arg-type]
                required_scopes=[TOKEN_SCOPE],
                validate_token_resource=False,
            ),
            log_level="WARNING",
        )
    else:
        server = MCPServer("harbor-pg", instructions=_INSTRUCTIONS, log_level="WARNING")

    def who(ctx: Context[Any, Any]) -> Caller:
        if caller is not None:
            return caller
        request = ctx.request_context.request
        user = getattr(request, "scope", {}).get("user") if request is not None else None
        token = getattr(user, "access_token", None) or get_access_token()
        claims = getattr(token, "claims", None) or {}
        identity = claims.get("harbor_identity")
        if not isinstance(identity, dict):
            raise ToolError("this request carries no harbor access token")
        return Caller(MemoryOwner(**identity), bool(claims.get("harbor_admin")))

    async def run(call: Any) -> Any:
        try:
            return await call
        except MemoryError as exc:
            raise ToolError(str(exc)) from None

    @server.tool(
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False),
    )
    async def remember(
        content: Annotated[str, Field(min_length=1, description="The fact, in one sentence.")],
        ctx: Context[Any, Any],
        scope: Annotated[
            WritableScope,
            Field(
                description="Who shares it: 'user' (this person, every conversation; the "
                "default), 'session' (this conversation only), 'project' (everyone in the "
                "project), 'run' (this agent run only)."
            ),
        ] = "user",
        memory_type: Annotated[
            MemoryKind,
            Field(description="fact, preference, decision or episode (something that happened)."),
        ] = "fact",
        importance: Annotated[
            float, Field(ge=0.0, le=1.0, description="0 (trivia) to 1 (must not be forgotten).")
        ] = 0.5,
        sensitivity: Annotated[
            SensitivityLevel,
            Field(description="none, low, pii (personal data) or sensitive (health, money...)."),
        ] = "none",
        entities: Annotated[
            list[str],
            Field(description="Ids of the people, systems or things it is about, if known."),
        ] = [],  # noqa: B006 - the SDK copies argument defaults per call
        context: Annotated[
            str | None,
            Field(description="The sentence before it, when the fact only makes sense with it."),
        ] = None,
    ) -> dict[str, Any]:
        """Save one durable fact about the user, their work or their preferences, so that it
        can be recalled in later conversations. Write it as a standalone sentence that names
        who or what it is about ("Dana owns the ingest pipeline", not "she owns it"). Saving
        the same fact twice in the same scope changes nothing and returns the existing id.
        Returns the memory's id and whether it is new."""
        me = who(ctx)
        result = await run(
            manager.inject_memory(
                me.owner,
                content,
                scope=scope,
                memory_type=memory_type,
                importance=importance,
                sensitivity=sensitivity,
                entity_ids=entities,
                context=context,
                source="tool:mcp",
            )
        )
        return {"id": result.memory.id, "created": result.created, "scope": scope}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def recall(
        query: Annotated[str, Field(min_length=1, description="What you want to know.")],
        ctx: Context[Any, Any],
        top_k: Annotated[int, Field(ge=1, le=50, description="How many memories, at most.")] = 5,
        memory_types: Annotated[
            list[MemoryKind], Field(description="Prefer these kinds (boosts, does not filter).")
        ] = [],  # noqa: B006
    ) -> dict[str, Any]:
        """Find the stored memories most relevant to a question, best first. Use it before
        answering anything that may depend on earlier conversations. Each result carries its
        ranking signals: dense_rank and similarity (meaning), lexical_rank (shared words),
        relevance (the two fused), recency, entity and type boosts, and the final score, so
        you can judge how well it matches. An empty list means nothing relevant is stored."""
        me = who(ctx)
        hits = await run(
            manager.recaller().recall_scored(
                me.owner, query, top_k=top_k, wanted_types=list(memory_types)
            )
        )
        return {
            "memories": [
                {
                    **_memory_view(hit.memory),
                    "rank": hit.rank,
                    "score": hit.score,
                    "relevance": hit.relevance,
                    "recency": hit.recency,
                    "entity": hit.entity,
                    "type_boost": hit.type_boost,
                    "dense_rank": hit.dense_rank,
                    "similarity": hit.similarity,
                    "lexical_rank": hit.lexical_rank,
                    "lexical_score": hit.lexical_score,
                }
                for hit in hits
            ]
        }

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def context(
        message: Annotated[
            str, Field(min_length=1, description="The user's new message, not yet answered.")
        ],
        ctx: Context[Any, Any],
    ) -> dict[str, Any]:
        """Everything memory offers for the turn you are about to answer, in one call: the
        recent conversation of this session (oldest first), the rolling summary of older
        turns, the question rewritten to stand alone, and the memories relevant to it. Call it
        once per user message, before answering; it does not store the message."""
        me = who(ctx)
        built = await run(manager.context_builder().build(me.owner, message))
        return {
            "recent": [{"role": m.role, "content": m.content} for m in built.messages],
            "summary": built.summary,
            "standalone_query": built.standalone_query,
            "memories": [_memory_view(m) for m in built.recalled],
            "degraded": list(built.degraded),
        }

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True))
    async def forget(
        memory_id: Annotated[str, Field(min_length=1, description="The id recall returned.")],
        ctx: Context[Any, Any],
    ) -> dict[str, Any]:
        """Delete one memory for good, by its id (from recall or remember). Use it when the
        user asks you to forget something or a memory is plainly wrong; to record that a fact
        changed, remember the new fact instead. Fails when no memory with that id is yours."""
        me = who(ctx)
        deleted = await run(manager.delete(me.owner, memory_id))
        if not deleted:
            raise ToolError(f"no memory with id {memory_id!r} that you may delete")
        return {"deleted": memory_id}

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def history(
        memory_id: Annotated[str, Field(min_length=1, description="The id recall returned.")],
        ctx: Context[Any, Any],
    ) -> dict[str, Any]:
        """How a memory changed over time: the versions it replaced, itself, and the versions
        that replaced it, oldest first, each with valid_from and invalid_at (null while it is
        still true). Use it to answer "what did I say before?" or "since when?"."""
        me = who(ctx)
        chain = await run(manager.history(me.owner, memory_id))
        if not chain:
            raise ToolError(f"no memory with id {memory_id!r} that you may read")
        return {"versions": [_memory_view(m) for m in chain]}

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=True))
    async def erase(
        ctx: Context[Any, Any],
        user_id: Annotated[
            str | None, Field(description="Erase everything of this user (right to erasure).")
        ] = None,
        session_id: Annotated[
            str | None, Field(description="With user_id or agent_id: only this session.")
        ] = None,
        agent_id: Annotated[
            str | None, Field(description="Erase everything this agent (principal) wrote.")
        ] = None,
    ) -> dict[str, Any]:
        """Administrators only: delete every conversation turn, working state and memory of
        a user (or of an agent, or of one of their sessions) in your tenant, at once and for
        good. Only on an explicit erasure request. Returns how many rows each tier lost."""
        me = who(ctx)
        if not me.is_admin:
            raise ToolError("erase needs an administrator's identity; nothing was erased")
        receipt = await run(
            manager.erase(
                me.owner.tenant_id,
                user_id=user_id,
                session_id=session_id,
                principal_id=agent_id,
            )
        )
        return {
            "short_term": receipt.short_term,
            "working": receipt.working,
            "long_term": receipt.long_term,
            "embeddings": receipt.embeddings,
        }

    @server.resource(
        "harbor://memories/{scope}",
        name="memories",
        description="Your currently valid memories in one scope (user, session or project), or "
        "in all three (all), newest first, as JSON.",
        mime_type="application/json",
    )
    async def memories(scope: str, ctx: Context[Any, Any]) -> str:
        me = who(ctx)
        scopes = _resource_scopes(scope)
        try:
            found = await manager.current_memories(me.owner, scopes, limit=200)
        except MemoryError as exc:
            raise ResourceError(str(exc)) from None
        return json.dumps([_memory_view(m) for m in found], ensure_ascii=False)

    @server.resource(
        "harbor://profile/{scope}",
        name="profile",
        description="Your profile: your current durable memories of one scope (user, session "
        "or project) or of all three (all), in two sections, stable (held for 30 days or "
        "more, most important first) and recent (newest first), within 400 tokens, as JSON.",
        mime_type="application/json",
    )
    async def profile(scope: str, ctx: Context[Any, Any]) -> str:
        me = who(ctx)
        scopes = _resource_scopes(scope)
        try:
            got = await manager.profile(me.owner, scopes=scopes)
        except MemoryError as exc:
            raise ResourceError(str(exc)) from None
        return json.dumps(
            {
                "stable": [_memory_view(e.memory) for e in got.stable],
                "recent": [_memory_view(e.memory) for e in got.recent],
                "tokens": got.tokens,
            },
            ensure_ascii=False,
        )

    return server


async def serve_stdio(manager: MemoryManager, caller: Caller) -> None:
    """Serve ``manager`` on stdin/stdout as ``caller`` until the client hangs up."""
    server = build_server(manager, caller=caller)
    await server.run_stdio_async()


async def serve_http(
    manager: MemoryManager,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    ready: Any = None,
) -> None:
    """Serve ``manager`` over streamable HTTP at ``http://host:port/mcp``, each request
    as its bearer token's identity, until cancelled. ``ready(url)`` is called once the
    socket listens."""
    import uvicorn

    if manager.database is None:
        raise ValueError("the HTTP server needs the PostgreSQL stores (tokens live there)")
    base = f"http://{host}:{port}"
    server = build_server(manager, tokens=TokenStore(manager.database), base_url=base)
    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")
    web = uvicorn.Server(config)
    if ready is not None:
        original = web.startup

        async def startup(sockets: Any = None) -> None:
            await original(sockets=sockets)
            ready(f"{base}/mcp")

        web.startup = startup  # type: ignore[method-assign]
    await web.serve()
