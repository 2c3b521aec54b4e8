"""Summaries without a caller: MemoryManager.append schedules the background summary.

After ``summarise_after_turns`` (default 20) turns a session is summarised in the
background, under the database lease and cooldown, without the caller waiting
for it; an append that finds nothing due writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg.rows import dict_row

from harbor_pg.db.connection import Database
from harbor_pg.llm.base import MemoryModelError
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.in_process import InMemoryLongTermStore, InMemoryShortTermStore
from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.conftest import PgDatabase
from tests.unit.test_builder_support import ScriptedModel, exchange

OWNER = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1")


@pytest_asyncio.fixture
async def second_database(fresh_db: PgDatabase) -> AsyncIterator[Database]:
    """Another worker process: its own pool on the same database."""
    db = Database(fresh_db.app_url, fresh_db.admin_url, min_size=1, max_size=4)
    await db.open()
    try:
        yield db
    finally:
        await db.close()


def session_state(db: PgDatabase) -> list[dict[str, Any]]:
    """Rows of harbor.session_state, with the tuple header: xmax <> 0 means the row was
    locked or updated after it was written (the lease statement locks it even when its
    WHERE turns the update down)."""
    with psycopg.connect(db.superuser_url, row_factory=dict_row) as conn:
        return conn.execute(
            "select session_id, summarised_at, summary_lease_until, turns_at_summary,"
            " xmin::text as xmin, xmax::text as xmax from harbor.session_state"
        ).fetchall()


async def append_all(
    manager: MemoryManager, turns: list[ConversationMessage], owner: MemoryOwner = OWNER
) -> None:
    for turn in turns:
        await manager.append(owner, turn)


async def test_the_twentieth_append_summarises_in_the_background(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(database)
    long_term = PostgresLongTermStore(database)
    await append_all(manager, exchange(9, words=10))  # 18 turns
    await manager.append(OWNER, ConversationMessage(role="user", content="turn 19"))
    await manager.drain()
    assert session_state(fresh_db) == []  # not due: nothing written, not even a lease row
    assert await long_term.load_summary(OWNER) is None

    await manager.append(OWNER, ConversationMessage(role="assistant", content="turn 20"))
    await manager.drain()
    [state] = session_state(fresh_db)
    assert state["turns_at_summary"] == 20 and state["summary_lease_until"] is None
    summary = await long_term.load_summary(OWNER)
    assert summary is not None and summary.source == "summary"
    assert len(await manager.recent(OWNER, 50)) == 20  # raw turns kept


async def test_appends_that_find_nothing_due_write_nothing(
    database: Database, fresh_db: PgDatabase
) -> None:
    policy = MemoryPolicy(summarise_after_turns=6, summary_keep_messages=2)
    manager = MemoryManager.from_database(database, policy=policy)
    await append_all(manager, exchange(3, words=10))
    await manager.drain()
    [first] = session_state(fresh_db)
    assert first["turns_at_summary"] == 6 and first["xmax"] == "0"
    # under the threshold, then over it but in the cooldown: the row is never touched again
    for turn in exchange(5, words=10):
        await manager.append(OWNER, turn)
        await manager.drain()
        assert session_state(fresh_db) == [first]
    # after the cooldown the next append is due and takes the lease
    with psycopg.connect(fresh_db.superuser_url) as conn:
        conn.execute("update harbor.session_state set summarised_at = now() - interval '301 s'")
    await manager.append(OWNER, ConversationMessage(role="user", content="one more"))
    await manager.drain()
    [after] = session_state(fresh_db)
    assert after["turns_at_summary"] == 17


async def test_append_does_not_wait_and_close_drains(database: Database) -> None:
    slow = ScriptedModel(delay=0.5)
    manager = MemoryManager.from_database(
        database,
        policy=MemoryPolicy(summarise_after_turns=6, summary_keep_messages=2),
        summary_model=slow,
    )
    long_term = PostgresLongTermStore(database)
    await append_all(manager, exchange(3, words=10)[:5])
    await manager.drain()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await manager.append(OWNER, ConversationMessage(role="assistant", content="sixth"))
    assert loop.time() - started < 0.4  # the summary call takes 0.5 s: append did not wait
    assert await long_term.load_summary(OWNER) is None
    await manager.close()  # waits for the running summary
    assert slow.count("summary") == 1
    summary = await long_term.load_summary(OWNER)
    assert summary is not None and summary.content == "summary number 1"


async def test_a_failing_summary_logs_a_warning_and_append_goes_on(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    failing = ScriptedModel(summaries=[MemoryModelError("HTTP 503")])
    manager = MemoryManager.from_database(
        database,
        policy=MemoryPolicy(summarise_after_turns=6, summary_keep_messages=2),
        summary_model=failing,
    )
    with caplog.at_level(logging.WARNING, logger="harbor_pg"):
        await append_all(manager, exchange(3, words=10))
        await manager.drain()
    assert failing.count("summary") == 1
    assert any(
        r.levelno == logging.WARNING and "HTTP 503" in r.getMessage() for r in caplog.records
    )
    assert len(await manager.recent(OWNER)) == 6


async def test_a_crashing_summariser_is_a_warning_too(
    database: Database, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = MemoryManager.from_database(database, policy=MemoryPolicy(summarise_after_turns=2))

    class Exploding:
        async def maybe_summarise(self, owner: MemoryOwner) -> bool:
            raise RuntimeError("summariser exploded")

    monkeypatch.setattr(manager, "background_summarizer", lambda **kw: Exploding())
    with caplog.at_level(logging.WARNING, logger="harbor_pg"):
        for text in ("hi", "hello"):
            stored = await manager.append(OWNER, ConversationMessage(role="user", content=text))
            assert stored.id is not None
        await manager.drain()
    assert any(
        r.levelno == logging.WARNING and "summariser exploded" in r.getMessage()
        for r in caplog.records
    )


async def test_appends_during_a_running_summary_look_again_with_a_read(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = ScriptedModel(delay=0.3)
    manager = MemoryManager.from_database(
        database,
        policy=MemoryPolicy(summarise_after_turns=6, summary_keep_messages=2),
        summary_model=slow,
    )
    assert manager.short_term is not None
    reads: list[bool] = []
    original = manager.short_term.summary_due  # type: ignore[attr-defined]

    async def counted(owner: MemoryOwner, **kwargs: Any) -> bool:
        reads.append(await original(owner, **kwargs))
        return reads[-1]

    monkeypatch.setattr(manager.short_term, "summary_due", counted)
    await append_all(manager, exchange(3, words=10))  # the sixth turn starts the summary
    await append_all(manager, exchange(2, words=10))  # four more while it runs
    await manager.drain()
    assert slow.count("summary") == 1
    assert reads == [False]  # one look afterwards (cooling down), not one per append


async def test_due_check_agrees_with_the_lease_postgres(database: Database) -> None:
    await due_check_agrees_with_the_lease(PostgresShortTermStore(database))


async def test_due_check_agrees_with_the_lease_in_process() -> None:
    await due_check_agrees_with_the_lease(InMemoryShortTermStore())


async def due_check_agrees_with_the_lease(store: Any) -> None:
    """summary_due and the due flag of append_and_check_summary say yes exactly when the
    lease would be granted."""
    rules = {"min_turns": 4, "cooldown_seconds": 0.5}

    async def append(n: int) -> bool:
        due = False
        for turn in exchange(n, words=3):
            _, due = await store.append_and_check_summary(OWNER, turn, **rules)
        return due

    async def due() -> bool:
        return bool(await store.summary_due(OWNER, **rules))

    async def lease() -> Any:
        return await store.acquire_summary_lease(OWNER, lease_seconds=0.3, **rules)

    assert await append(1) is False and await due() is False  # 2 turns
    assert await lease() is None
    assert await append(1) is True and await due() is True  # 4 turns
    held = await lease()
    assert held is not None
    assert await due() is False  # leased
    assert await append(1) is False  # 6 turns, still leased
    assert await store.finish_summary_lease(OWNER, held, turns_at_summary=held.turns)
    assert await append(2) is False and await due() is False  # 10 turns, cooling down
    assert await lease() is None
    await asyncio.sleep(0.6)
    assert await due() is True  # 10 - 4 >= 4 and the cooldown is over
    held = await lease()
    assert held is not None
    assert await store.finish_summary_lease(OWNER, held, turns_at_summary=10)
    await asyncio.sleep(0.6)
    assert await append(1) is False and await due() is False  # 12 - 10 < 4
    assert await lease() is None
    assert await append(1) is True  # 14 - 10 >= 4


async def test_two_workers_appending_to_one_session_summarise_it_once(
    database: Database, second_database: Database, fresh_db: PgDatabase
) -> None:
    policy = MemoryPolicy(summarise_after_turns=6, summary_keep_messages=2)
    models = [ScriptedModel(delay=0.05), ScriptedModel(delay=0.05)]
    workers = [
        MemoryManager.from_database(db, policy=policy, summary_model=model)
        for db, model in zip((database, second_database), models, strict=True)
    ]
    turns = exchange(6, words=10)
    for i, turn in enumerate(turns):  # the two workers take turns, as behind a load balancer
        await workers[i % 2].append(OWNER, turn)
    await asyncio.gather(*(w.drain() for w in workers))
    assert sum(m.count("summary") for m in models) == 1
    [state] = session_state(fresh_db)
    assert state["summary_lease_until"] is None and state["turns_at_summary"] >= 6


async def test_no_background_summary_when_switched_off(
    database: Database, fresh_db: PgDatabase
) -> None:
    for manager in (
        MemoryManager.from_database(
            database,
            policy=MemoryPolicy(summarise_after_turns=2),
            config=MemoryManagerConfig(summarise_in_background=False),
        ),
        MemoryManager.from_database(database, policy=MemoryPolicy.disabled()),
    ):
        await append_all(manager, exchange(2, words=5))
        await manager.drain()
    # an owner without a principal (user_id only) is not summarised either
    by_user = MemoryOwner(tenant_id="t1", user_id="bob", session_id="s1")
    manager = MemoryManager.from_database(database, policy=MemoryPolicy(summarise_after_turns=2))
    await append_all(manager, exchange(2, words=5), by_user)
    await manager.drain()
    assert session_state(fresh_db) == []


async def test_in_process_stores_summarise_after_append_too() -> None:
    manager = await MemoryManager.create(
        in_process=True, policy=MemoryPolicy(summarise_after_turns=6, summary_keep_messages=2)
    )
    await append_all(manager, exchange(2, words=10))
    await manager.drain()
    assert isinstance(manager.long_term, InMemoryLongTermStore)
    assert await manager.long_term.load_summary(OWNER) is None
    await append_all(manager, exchange(1, words=10))
    await manager.close()
    assert await manager.long_term.load_summary(OWNER) is not None


def test_the_append_statement_inlines_the_due_rule(fresh_db: PgDatabase) -> None:
    """The due rule rides in the INSERT as part of its plan, not as a function the
    executor calls for the row (that call cost each append about 0.6 ms)."""
    from psycopg.types.json import Jsonb

    from harbor_pg.db.sqlfiles import query

    params = {
        "tenant_id": "t1",
        "user_id": "alice",
        "session_id": "s1",
        "project_id": "",
        "principal_id": "alice",
        "role": "user",
        "content": "hello",
        "name": None,
        "tool_calls": Jsonb([]),
        "tool_call_id": None,
        "metadata": Jsonb({}),
        "token_estimate": 2,
        "min_turns": 20,
        "cooldown_seconds": 60.0,
    }
    with psycopg.connect(fresh_db.app_url) as conn:
        conn.execute(
            "select harbor.set_identity('t1', principal_id => 'alice', session_id => 's1')"
        )
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                "explain (verbose, costs off) " + query("append_message_check_summary"), params
            )
        )
        conn.rollback()
    assert "summary_due" not in plan, plan
    assert "session_state" in plan, plan
