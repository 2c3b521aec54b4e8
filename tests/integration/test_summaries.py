"""Background session summaries against the real PostgreSQL: the lease, cooldown and turn mark.

The lease lives in ``harbor.session_state`` and is taken with one atomic
INSERT ... ON CONFLICT DO UPDATE ... WHERE ... RETURNING, so of two workers
(two separate connection pools here) exactly one summarises a session.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest_asyncio
from psycopg.rows import dict_row

from harbor_pg.context.summarizer import SessionSummarizer, frontier_of
from harbor_pg.db.connection import Database
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.conftest import PgDatabase
from tests.unit.test_builder_support import ScriptedModel, exchange

OWNER = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1")
BOB = MemoryOwner(tenant_id="t1", principal_id="bob", session_id="s1")


@pytest_asyncio.fixture
async def second_database(fresh_db: PgDatabase) -> AsyncIterator[Database]:
    """A second, independent pool on the same database: another worker process."""
    db = Database(fresh_db.app_url, fresh_db.admin_url, min_size=1, max_size=4)
    await db.open()
    try:
        yield db
    finally:
        await db.close()


def worker(database: Database, **kwargs: Any) -> SessionSummarizer:
    policy = kwargs.pop("policy", MemoryPolicy())
    return SessionSummarizer(
        policy=policy,
        messages=PostgresShortTermStore(database),
        memories=PostgresLongTermStore(database),
        **kwargs,
    )


async def fill(
    database: Database, messages: list[ConversationMessage], owner: MemoryOwner = OWNER
) -> list[ConversationMessage]:
    store = PostgresShortTermStore(database)
    return [await store.append(owner, m) for m in messages]


def session_state(db: PgDatabase) -> list[dict[str, Any]]:
    with psycopg.connect(db.superuser_url, row_factory=dict_row) as conn:
        return conn.execute(
            "select tenant_id, user_id, session_id, summarised_at, summary_lease_until,"
            " turns_at_summary from harbor.session_state order by user_id"
        ).fetchall()


async def test_summary_runs_after_twenty_turns_and_records_the_lease_row(
    database: Database, fresh_db: PgDatabase
) -> None:
    summariser = worker(database)
    await fill(database, exchange(9, words=10))  # 18 turns
    assert await summariser.maybe_summarise(OWNER) is False
    assert session_state(fresh_db) == []  # nothing written below the threshold
    stored = await fill(database, exchange(1, words=10))  # 20 turns
    assert await summariser.maybe_summarise(OWNER) is True

    [state] = session_state(fresh_db)
    assert (state["tenant_id"], state["user_id"], state["session_id"]) == ("t1", "alice", "s1")
    assert state["summarised_at"] is not None
    assert state["summary_lease_until"] is None
    assert state["turns_at_summary"] == 20
    row = await PostgresLongTermStore(database).load_summary(OWNER)
    assert row is not None and row.source == "summary"
    assert frontier_of(row) is not None and frontier_of(row) < (stored[-1].id or 0)
    assert await PostgresShortTermStore(database).count(OWNER) == 20  # raw turns kept


async def test_cooldown_is_enforced_by_the_database(
    database: Database, fresh_db: PgDatabase
) -> None:
    summariser = worker(database)
    await fill(database, exchange(10, words=10))
    assert await summariser.maybe_summarise(OWNER) is True
    await fill(database, exchange(10, words=10))
    assert await summariser.maybe_summarise(OWNER) is False  # 20 new turns, but cooling down
    # a fresh worker (another process) sees the same cooldown
    assert await worker(database).maybe_summarise(OWNER) is False
    with psycopg.connect(fresh_db.superuser_url) as conn:
        conn.execute("update harbor.session_state set summarised_at = now() - interval '301 s'")
    assert await summariser.maybe_summarise(OWNER) is True
    [state] = session_state(fresh_db)
    assert state["turns_at_summary"] == 40


async def test_new_turns_are_needed_after_a_summary(database: Database) -> None:
    policy = MemoryPolicy(summarise_after_turns=6, summary_cooldown_seconds=0)
    summariser = worker(database, policy=policy)
    await fill(database, exchange(4, words=10))
    assert await summariser.maybe_summarise(OWNER) is True
    assert await summariser.maybe_summarise(OWNER) is False
    await fill(database, exchange(2, words=10))  # 4 new turns: not yet
    assert await summariser.maybe_summarise(OWNER) is False
    await fill(database, exchange(1, words=10))
    assert await summariser.maybe_summarise(OWNER) is True


async def test_two_concurrent_workers_exactly_one_runs(
    database: Database, second_database: Database, fresh_db: PgDatabase
) -> None:
    await fill(database, exchange(12, words=10))
    model_a, model_b = ScriptedModel(delay=0.05), ScriptedModel(delay=0.05)
    a = worker(database, model=model_a)
    b = worker(second_database, model=model_b)
    results = await asyncio.gather(a.maybe_summarise(OWNER), b.maybe_summarise(OWNER))
    assert sorted(results) == [False, True]
    assert model_a.count("summary") + model_b.count("summary") == 1
    [state] = session_state(fresh_db)
    assert state["turns_at_summary"] == 24 and state["summary_lease_until"] is None


async def test_many_concurrent_workers_exactly_one_runs(
    database: Database, second_database: Database
) -> None:
    for round_ in range(3):
        owner = OWNER.model_copy(update={"session_id": f"race-{round_}"})
        await fill(database, exchange(10, words=5), owner)
        models = [ScriptedModel(delay=0.02) for _ in range(8)]
        workers = [
            worker((database, second_database)[i % 2], model=m) for i, m in enumerate(models)
        ]
        results = await asyncio.gather(*(w.maybe_summarise(owner) for w in workers))
        assert sum(results) == 1
        assert sum(m.count("summary") for m in models) == 1


async def test_a_live_lease_blocks_others_until_it_expires(
    database: Database, second_database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresShortTermStore(database)
    await fill(database, exchange(10, words=10))
    lease = await store.acquire_summary_lease(
        OWNER, min_turns=20, cooldown_seconds=300, lease_seconds=1.5
    )
    assert lease is not None and lease.turns == 20 and lease.turns_at_summary == 0
    other = worker(second_database)
    assert await other.maybe_summarise(OWNER) is False  # held by the first worker
    await asyncio.sleep(1.6)
    assert await other.maybe_summarise(OWNER) is True  # the crashed holder's lease expired
    # the first holder's lease is gone: finishing with it changes nothing
    assert await store.finish_summary_lease(OWNER, lease, turns_at_summary=99) is False
    [state] = session_state(fresh_db)
    assert state["turns_at_summary"] == 20


async def test_leases_are_per_session_and_row_level_secured(
    database: Database, fresh_db: PgDatabase
) -> None:
    await fill(database, exchange(10, words=10))
    await fill(database, exchange(10, words=10), BOB)
    summariser = worker(database)
    assert await summariser.maybe_summarise(OWNER) is True
    assert await summariser.maybe_summarise(BOB) is True  # same session id, another user
    assert [s["user_id"] for s in session_state(fresh_db)] == ["alice", "bob"]
    # as the application role, a caller sees only its own session's row
    async with database.transaction(BOB) as conn:
        rows = await (await conn.execute("select user_id from harbor.session_state")).fetchall()
    assert rows == [{"user_id": "bob"}]


async def test_failed_summary_leaves_the_lease_to_expire(
    database: Database, fresh_db: PgDatabase
) -> None:
    from harbor_pg.llm.base import MemoryModelError

    await fill(database, exchange(10, words=10))
    failing = worker(
        database, model=ScriptedModel(summaries=[MemoryModelError("HTTP 503")]), lease_seconds=1.5
    )
    assert await failing.maybe_summarise(OWNER) is False
    [state] = session_state(fresh_db)
    assert state["summarised_at"] is None and state["summary_lease_until"] is not None
    assert await worker(database).maybe_summarise(OWNER) is False
    await asyncio.sleep(1.6)
    assert await worker(database).maybe_summarise(OWNER) is True


async def test_scheduled_background_summary(database: Database) -> None:
    await fill(database, exchange(10, words=10))
    summariser = worker(database)
    task = summariser.schedule(OWNER)
    await summariser.drain()
    assert task.result() is True
    assert await PostgresLongTermStore(database).load_summary(OWNER) is not None
