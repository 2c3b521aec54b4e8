"""Session TTL (seed 004): a session idle for session_ttl_hours loses its recent turns.

The turns are invisible at once (the read predicate decides), a turn after the
expiry starts afresh, apply_retention reclaims them, and summaries and
memories extracted from them stay. The TTL is per manager; None never expires.
"""

from __future__ import annotations

import asyncio

import pytest

from harbor_pg import ConversationMessage, Memory, MemoryManager, MemoryManagerConfig, MemoryOwner
from harbor_pg.context.summarizer import FRONTIER_KEY
from harbor_pg.db.connection import Database
from harbor_pg.owner import MemoryScope
from harbor_pg.records import MemoryType
from harbor_pg.tiers.base import summary_memory_id
from harbor_pg.tiers.in_process import (
    InMemoryLongTermStore,
    InMemoryShortTermStore,
    InMemoryWorkingStore,
)

OWNER = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1", run_id="r1")
OTHER = OWNER.model_copy(update={"session_id": "s2"})
ONE_SECOND = MemoryManagerConfig(session_ttl_hours=1 / 3600)
NEVER = MemoryManagerConfig(session_ttl_hours=None)


def _managers(backend: str, database: Database) -> tuple[MemoryManager, MemoryManager]:
    if backend == "postgres":
        return (
            MemoryManager.from_database(database, config=ONE_SECOND),
            MemoryManager.from_database(database, config=NEVER),
        )
    stores = {
        "short_term": InMemoryShortTermStore(),
        "working": InMemoryWorkingStore(),
        "long_term": InMemoryLongTermStore(),
    }
    return MemoryManager(**stores, config=ONE_SECOND), MemoryManager(**stores, config=NEVER)


def _texts(turns: list[ConversationMessage]) -> list[str]:
    return [t.content for t in turns]


def test_default_is_a_day_and_none_means_never() -> None:
    assert MemoryManagerConfig().session_ttl_hours == 24.0
    assert MemoryManagerConfig().session_ttl_seconds == 86_400
    assert NEVER.session_ttl_seconds is None


@pytest.mark.parametrize("backend", ["in_process", "postgres"])
async def test_idle_session_expires_and_retention_reclaims_it(
    backend: str, database: Database
) -> None:
    expiring, never = _managers(backend, database)
    first = await expiring.append(OWNER, ConversationMessage(role="user", content="a1"))
    second = await expiring.append(OWNER, ConversationMessage(role="assistant", content="a2"))
    await expiring.append(OTHER, ConversationMessage(role="user", content="other session"))
    assert _texts(await expiring.recent(OWNER)) == ["a1", "a2"]
    # a memory extracted from the first turn, and the session's rolling summary
    fact = await expiring.save(
        OWNER,
        Memory(
            content="u1 owns the ingest pipeline",
            source="extracted",
            source_session_id="s1",
            source_message_ids=[str(first.id)],
        ),
    )
    assert expiring.long_term is not None
    summary = await expiring.long_term.save_summary(  # type: ignore[attr-defined]
        OWNER,
        Memory(
            id=summary_memory_id(OWNER),
            scope=MemoryScope.SESSION,
            memory_type=MemoryType.SUMMARY,
            content="u1 and the bot discussed ingest.",
            metadata={FRONTIER_KEY: second.id},
        ),
        expected_frontier=None,
    )
    assert summary is not None

    await asyncio.sleep(1.3)
    # invisible at once, for every read that serves a turn
    assert await expiring.recent(OWNER) == []
    assert (await expiring.snapshot(OWNER, recent_limit=10)).recent == []
    context = await expiring.context_builder().build(OWNER, "what did we say?")
    assert context.messages == ()
    # another manager, configured to keep turns forever, still sees them: the TTL is its own
    assert _texts(await never.recent(OWNER)) == ["a1", "a2"]

    # a turn after the expiry starts a fresh window
    await expiring.append(OWNER, ConversationMessage(role="user", content="b1"))
    assert _texts(await expiring.recent(OWNER)) == ["b1"]

    receipt = await expiring.apply_retention("t1")
    assert receipt.short_term == 3  # a1, a2 and the idle other session; b1 stays
    assert _texts(await never.recent(OWNER)) == ["b1"]
    assert await never.recent(OTHER) == []
    # summaries and extracted memories are unaffected
    assert await expiring.get(OWNER, fact.memory.id or "") is not None
    kept = await expiring.long_term.load_summary(OWNER)  # type: ignore[attr-defined]
    assert kept is not None and kept.content == "u1 and the bot discussed ingest."
    assert (await never.apply_retention("t1")).short_term == 0
    await expiring.close()
    await never.close()
