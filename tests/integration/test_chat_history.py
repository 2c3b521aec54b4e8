"""HarborChatMessageHistory and LangChain message round trips through PostgreSQL."""

from __future__ import annotations

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from harbor_pg.chat_history import HarborChatMessageHistory
from harbor_pg.db.connection import Database
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner

OWNER = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1")


async def test_history_round_trips_langchain_messages(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    history = HarborChatMessageHistory(manager, OWNER)
    sent = [
        SystemMessage(content="be brief"),
        HumanMessage(content="what is 2+2?"),
        AIMessage(content="", tool_calls=[{"id": "c1", "name": "calc", "args": {"x": "2+2"}}]),
        ToolMessage(content="4", tool_call_id="c1"),
        AIMessage(content="4"),
    ]
    await history.aadd_messages(sent)
    got = await history.aget_messages()
    assert [type(m) for m in got] == [type(m) for m in sent]
    assert [m.content for m in got] == [m.content for m in sent]
    assert got[2].tool_calls[0]["name"] == "calc"  # type: ignore[attr-defined]
    assert got[3].tool_call_id == "c1"  # type: ignore[attr-defined]
    other = HarborChatMessageHistory(manager, OWNER.model_copy(update={"session_id": "s2"}))
    assert await other.aget_messages() == []
    await history.aclear()
    assert await history.aget_messages() == []


async def test_sync_members_explain_themselves(database: Database) -> None:
    history = HarborChatMessageHistory(MemoryManager.from_database(database), OWNER)
    with pytest.raises(MemoryConfigurationError, match="async"):
        _ = history.messages
