"""Dedup under concurrency: a duplicate committed by a later transaction is still found."""

from __future__ import annotations

import asyncio

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
