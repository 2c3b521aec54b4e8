"""Dedup under concurrency: a duplicate committed by a later transaction is still found."""

from __future__ import annotations

import asyncio
import contextlib

from harbor_pg.db.connection import Database
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from harbor_pg.tiers.long_term import PostgresLongTermStore, memory_params

ALICE = MemoryOwner(tenant_id="t1", user_id="alice")


async def test_duplicate_from_a_transaction_that_began_later(database: Database) -> None:
    """Our transaction's now() precedes the other writer's row: the lookup must still see it."""
    store = PostgresLongTermStore(database)
    params = memory_params(ALICE, Memory(content="Alice keeps bees"))
    async with database.transaction(ALICE) as conn:
        await conn.execute("select pg_catalog.now()")  # pin this transaction's now()
        await asyncio.sleep(0.05)
        other = await store.save(ALICE, Memory(content="Alice keeps bees"))
        assert other.created
        memory_id, created = await PostgresLongTermStore.save_in(conn, params)
    assert not created
    assert memory_id == other.memory.id


async def test_many_concurrent_saves_return_one_id(database: Database) -> None:
    store = PostgresLongTermStore(database)
    for round_ in range(5):
        results = await asyncio.gather(
            *[store.save(ALICE, Memory(content=f"Race {round_}")) for _ in range(8)]
        )
        assert sum(r.created for r in results) == 1
        assert len({r.memory.id for r in results}) == 1


async def _close(conn: object, memory_id: str) -> None:
    """End a memory's interval now, as supersession does (the caller's transaction)."""
    await conn.execute(  # type: ignore[attr-defined]
        "update harbor.memories set valid = tstzrange(lower(valid), now(), '[)')"
        " where tenant_id = %s and id = %s",
        (ALICE.tenant_id, memory_id),
    )


async def test_a_content_closed_by_a_later_transaction_is_current_no_more(
    database: Database,
) -> None:
    """Dedup is of current rows: once a transaction that began after ours has closed
    the memory, our save of the same content is a new current memory, even though
    its interval starts before the other's end."""
    store = PostgresLongTermStore(database)
    first = await store.save(ALICE, Memory(content="Alice keeps wasps"))
    params = memory_params(ALICE, Memory(content="Alice keeps wasps"))
    async with database.transaction(ALICE) as conn:
        await conn.execute("select pg_catalog.now()")  # pin this transaction's now()
        await asyncio.sleep(0.05)
        async with database.transaction(ALICE) as other:
            await _close(other, first.memory.id or "")
        memory_id, created = await PostgresLongTermStore.save_in(conn, params)
    assert created
    assert memory_id != first.memory.id
    rows = await store.search(ALICE, "wasps", limit=10)
    assert [m.id for m in rows] == [memory_id]


async def test_a_save_waits_for_a_supersession_in_flight(database: Database) -> None:
    """A writer that closes a memory and one that saves its content again at the
    same time: the save waits for the close, then inserts when it committed and
    finds the old memory when it rolled back; one current row either way."""
    store = PostgresLongTermStore(database)
    for commit in (True, False):
        content = f"Alice keeps hornets ({commit})"
        first = await store.save(ALICE, Memory(content=content))
        with contextlib.suppress(_RolledBack):
            async with database.transaction(ALICE) as conn:
                await _close(conn, first.memory.id or "")
                again = asyncio.create_task(store.save(ALICE, Memory(content=content)))
                await asyncio.sleep(0.3)
                assert not again.done()  # waiting on the closed row's unique entry
                if not commit:
                    raise _RolledBack
        result = await again
        assert result.created is commit
        assert (result.memory.id == first.memory.id) is not commit
        current = await store.search(ALICE, content, limit=10)
        assert [m.id for m in current if m.content == content] == [result.memory.id]


class _RolledBack(Exception):
    pass
