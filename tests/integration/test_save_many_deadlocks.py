"""Batches of the same facts saved concurrently in different orders neither
deadlock nor fail: rows are locked in dedup-key order, and a conflict that
still happens is retried inside the library a bounded number of times."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from harbor_pg import MemoryConcurrencyError, MemoryManager, MemoryOwner
from harbor_pg.db.connection import Database, harbor_error
from harbor_pg.db.errors import ShardMovedError
from harbor_pg.errors import MemoryDatabaseError, MemoryValidationError
from harbor_pg.records import Memory
from tests.conftest import PgDatabase

ALICE = MemoryOwner(tenant_id="t1", principal_id="alice")
FACTS = [f"Alice fact number {i}" for i in range(8)]


async def test_two_managers_saving_the_same_facts_in_other_orders(fresh_db: PgDatabase) -> None:
    dbs = [Database(fresh_db.app_url, min_size=1, max_size=2) for _ in range(2)]
    for db in dbs:
        await db.open()
    managers = [MemoryManager.from_database(db) for db in dbs]
    try:
        for batch in range(10):
            facts = [f"{fact} (batch {batch})" for fact in FACTS]
            forward = [Memory(content=f) for f in facts]
            backward = [Memory(content=f) for f in reversed(facts)]
            first, second = await asyncio.gather(
                managers[0].save_many(ALICE, forward), managers[1].save_many(ALICE, backward)
            )
            # both report every fact, in the order given, under one id each
            assert [r.memory.content for r in first] == facts
            assert [r.memory.content for r in second] == list(reversed(facts))
            ids = {r.memory.content: r.memory.id for r in first}
            assert {r.memory.content: r.memory.id for r in second} == ids
            assert sum(r.created for r in first + second) == len(facts)
        with psycopg.connect(fresh_db.superuser_url) as conn:
            row = conn.execute(
                "select count(*), count(distinct content) from harbor.memories"
                " where upper_inf(valid)"
            ).fetchone()
        assert row == (80, 80)  # no duplicate current row
    finally:
        for db in dbs:
            await db.close()


async def test_a_conflict_that_persists_is_its_own_error(database: Database) -> None:
    calls = 0

    async def always_deadlocks() -> None:
        nonlocal calls
        calls += 1
        raise harbor_error(psycopg.errors.DeadlockDetected("deadlock detected"))

    with pytest.raises(MemoryConcurrencyError, match="after 4 attempts") as info:
        await database.retrying(always_deadlocks)
    assert calls == 4
    # a subclass of the database error, never "database unavailable"
    assert isinstance(info.value, MemoryDatabaseError)
    assert "unavailable" not in str(info.value)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (psycopg.errors.DeadlockDetected, MemoryConcurrencyError),
        (psycopg.errors.SerializationFailure, MemoryConcurrencyError),
        (psycopg.errors.NumericValueOutOfRange, MemoryValidationError),
        (psycopg.errors.DatetimeFieldOverflow, MemoryValidationError),
        (psycopg.errors.UntranslatableCharacter, MemoryValidationError),
        (psycopg.errors.StatementTooComplex, MemoryValidationError),
        (psycopg.errors.AdminShutdown, MemoryDatabaseError),
    ],
)
def test_errors_map_by_sqlstate_class(error: type[psycopg.Error], expected: type) -> None:
    mapped = harbor_error(error("boom"))
    assert type(mapped) is expected
    assert "boom" in str(mapped)


def test_a_statement_that_met_a_replaced_shard_is_a_shard_move_and_nothing_else() -> None:
    # Citus's error for a statement planned against a shard that a move or an isolation
    # replaced before it ran: the one-round-trip calls run it again (tests/citus,
    # test_shard_move.py, under a real isolation); any other internal error is not one
    moved = harbor_error(
        psycopg.errors.InternalError_("could not find valid entry for shard 102011")
    )
    assert isinstance(moved, ShardMovedError) and isinstance(moved, MemoryConcurrencyError)
    other = harbor_error(psycopg.errors.InternalError_("could not find valid entry"))
    assert type(other) is MemoryDatabaseError


async def test_a_one_round_trip_call_runs_again_after_a_shard_moved(database: Database) -> None:
    calls = 0

    async def moved_once() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise harbor_error(
                psycopg.errors.InternalError_("could not find valid entry for shard 7")
            )
        return calls

    assert await database.retrying(moved_once, retry_on=ShardMovedError) == 2
    # and only that conflict: a deadlock is the caller's to see at once
    deadlocks = 0

    async def deadlocked() -> int:
        nonlocal deadlocks
        deadlocks += 1
        raise harbor_error(psycopg.errors.DeadlockDetected("deadlock detected"))

    with pytest.raises(MemoryConcurrencyError):
        await database.retrying(deadlocked, retry_on=ShardMovedError)
    assert deadlocks == 1
