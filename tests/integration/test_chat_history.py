"""HarborChatMessageHistory and LangChain message round trips, async and sync."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from harbor_pg import HarborChatMessageHistory
from harbor_pg.db.connection import Database
from harbor_pg.errors import MemoryConfigurationError, MemoryValidationError
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.in_process import InMemoryShortTermStore
from tests.conftest import PgDatabase

OWNER = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1")
SENT = [
    SystemMessage(content="be brief"),
    HumanMessage(content="what is 2+2?"),
    AIMessage(content="", tool_calls=[{"id": "c1", "name": "calc", "args": {"x": "2+2"}}]),
    ToolMessage(content="4", tool_call_id="c1"),
    AIMessage(content="4"),
]


def assert_round_trip(got: list) -> None:  # type: ignore[type-arg]
    assert [type(m) for m in got] == [type(m) for m in SENT]
    assert [m.content for m in got] == [m.content for m in SENT]
    assert got[2].tool_calls[0]["name"] == "calc"
    assert got[3].tool_call_id == "c1"


async def test_history_round_trips_langchain_messages(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    history = HarborChatMessageHistory(manager, OWNER)
    await history.aadd_messages(SENT)
    assert_round_trip(await history.aget_messages())
    other = HarborChatMessageHistory(manager, OWNER.model_copy(update={"session_id": "s2"}))
    assert await other.aget_messages() == []
    await history.aclear()
    assert await history.aget_messages() == []


def count_side_connections(database: Database, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count uses of the short-lived sync connection (the path that bypasses the pools)."""
    calls: list[int] = []
    original = database.sync_transaction

    def counted(owner: MemoryOwner):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(owner)

    monkeypatch.setattr(database, "sync_transaction", counted)
    return calls


async def test_sync_members_from_another_thread_use_the_pools_loop(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync caller in a worker thread while the pools' loop runs (FastAPI sync endpoints,
    ``RunnableWithMessageHistory.invoke`` in a thread pool)."""
    side = count_side_connections(database, monkeypatch)
    manager = MemoryManager.from_database(database)
    history = HarborChatMessageHistory(manager, OWNER)
    caller_threads: list[str] = []

    def sync_caller() -> list:  # type: ignore[type-arg]
        caller_threads.append(threading.current_thread().name)
        history.add_messages(SENT)
        got = history.messages
        history.clear()
        return got

    got = await asyncio.to_thread(sync_caller)
    assert caller_threads != [threading.current_thread().name]
    assert_round_trip(got)
    assert await history.aget_messages() == []
    assert side == []  # every call ran on the pools' own loop


async def test_sync_members_inside_the_pools_loop(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Called from a coroutine on the loop that runs the pools: a short-lived connection."""
    side = count_side_connections(database, monkeypatch)
    manager = MemoryManager.from_database(database)
    history = HarborChatMessageHistory(manager, OWNER)
    history.add_messages(SENT)
    assert_round_trip(history.messages)
    assert len(side) == len(SENT) + 1
    # the async view sees the same rows
    assert_round_trip(await history.aget_messages())
    history.clear()
    assert history.messages == []
    # the pools are untouched and still serve async calls
    await manager.append(OWNER, ConversationMessage(role="user", content="after"))
    assert [m.content for m in history.messages] == ["after"]


async def test_sync_add_validates_every_message_before_writing(database: Database) -> None:
    manager = MemoryManager.from_database(
        database, config=MemoryManagerConfig(max_content_chars=10)
    )
    history = HarborChatMessageHistory(manager, OWNER)
    with pytest.raises(MemoryValidationError):
        history.add_messages([HumanMessage(content="short"), HumanMessage(content="x" * 11)])
    assert history.messages == []
    with pytest.raises(MemoryValidationError):
        await history.aadd_messages([HumanMessage(content="short"), HumanMessage(content="y" * 11)])
    assert await history.aget_messages() == []


@pytest.fixture
def closed_loop_db(fresh_db: PgDatabase) -> Iterator[Database]:
    """A Database whose pools were opened on an event loop that has since finished."""
    db = Database(fresh_db.app_url, fresh_db.admin_url, min_size=1, max_size=2)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(db.open())
    try:
        yield db
    finally:
        loop.run_until_complete(db.close())
        loop.close()


def test_sync_members_with_no_loop_running(closed_loop_db: Database) -> None:
    """Plain sync code (``chain.invoke`` in a script): no loop runs the pools."""
    assert closed_loop_db.loop is not None and not closed_loop_db.loop.is_running()
    history = HarborChatMessageHistory(MemoryManager.from_database(closed_loop_db), OWNER)
    history.add_messages(SENT)
    assert_round_trip(history.messages)
    other = HarborChatMessageHistory(
        MemoryManager.from_database(closed_loop_db),
        MemoryOwner(tenant_id="t1", principal_id="u2", session_id="s1"),
    )
    assert other.messages == []  # still scoped by the identity
    history.clear()
    assert history.messages == []


# deprecated in favour of LangGraph persistence, still the interface's main consumer
@pytest.mark.filterwarnings("ignore::langchain_core._api.deprecation.LangChainDeprecationWarning")
async def test_runnable_with_message_history_sync_invoke(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    prompt = ChatPromptTemplate.from_messages(
        [MessagesPlaceholder("history"), ("human", "{question}")]
    )
    chain = RunnableWithMessageHistory(
        prompt | FakeListChatModel(responses=["Paris", "Berlin"]),
        lambda session_id: HarborChatMessageHistory(
            manager, OWNER.model_copy(update={"session_id": session_id})
        ),
        input_messages_key="question",
        history_messages_key="history",
    )
    config = {"configurable": {"session_id": "chat-1"}}
    first = await asyncio.to_thread(chain.invoke, {"question": "capital of France?"}, config)
    assert first.content == "Paris"
    second = await chain.ainvoke({"question": "and Germany?"}, config)
    assert second.content == "Berlin"
    history = HarborChatMessageHistory(manager, OWNER.model_copy(update={"session_id": "chat-1"}))
    assert [m.content for m in await history.aget_messages()] == [
        "capital of France?",
        "Paris",
        "and Germany?",
        "Berlin",
    ]


def test_in_process_sync_without_a_loop() -> None:
    manager = MemoryManager(short_term=InMemoryShortTermStore())
    history = HarborChatMessageHistory(manager, OWNER)
    history.add_messages(SENT)
    assert_round_trip(history.messages)
    history.clear()
    assert history.messages == []


async def test_in_process_sync_inside_a_running_loop() -> None:
    manager = MemoryManager(short_term=InMemoryShortTermStore())
    history = HarborChatMessageHistory(manager, OWNER)
    history.add_messages(SENT)
    assert_round_trip(history.messages)
    assert_round_trip(await history.aget_messages())
    history.clear()
    assert await history.aget_messages() == []


class _CustomStore:
    """A store of the application's own (not one harbor-pg knows how to drive sync)."""

    def __init__(self) -> None:
        self._inner = InMemoryShortTermStore()

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)


async def test_custom_store_inside_a_running_loop_explains_itself() -> None:
    manager = MemoryManager(short_term=_CustomStore())  # type: ignore[arg-type]
    history = HarborChatMessageHistory(manager, OWNER)
    with pytest.raises(MemoryConfigurationError, match="aget_messages"):
        _ = history.messages
    # outside a loop it works
    assert await asyncio.to_thread(lambda: history.messages) == []
