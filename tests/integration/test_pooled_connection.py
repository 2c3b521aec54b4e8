"""A pooled connection's way back to the pool: a transaction its user left open is
committed on a normal exit and rolled back on an error, as psycopg's own connection
context does; the connection comes back idle and usable either way."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest
import pytest_asyncio

from harbor_pg import MemoryOwner
from harbor_pg.db.connection import Database
from tests.conftest import PgDatabase

OWNER = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1")
IDLE = psycopg.pq.TransactionStatus.IDLE


@pytest_asyncio.fixture
async def single(fresh_db: PgDatabase) -> AsyncIterator[Database]:
    # one connection: each use below gets the connection the one before it returned
    db = Database(fresh_db.app_url, min_size=1, max_size=1)
    await db.open()
    try:
        yield db
    finally:
        await db.close()


async def _probe(db: Database) -> str | None:
    async with db.autocommit() as conn:
        assert conn.info.transaction_status == IDLE
        row = await (
            await conn.execute("select current_setting('harbor.probe', true) as v")
        ).fetchone()
        return None if row is None else row["v"]


async def test_a_transaction_left_open_is_committed(single: Database) -> None:
    async with single.autocommit() as conn:
        await conn.execute("begin")
        await conn.execute("select set_config('harbor.probe', 'kept', false)")
        assert conn.info.transaction_status != IDLE
    assert await _probe(single) == "kept"


async def test_an_error_rolls_the_open_transaction_back(single: Database) -> None:
    with pytest.raises(RuntimeError, match="the caller failed"):
        async with single.autocommit() as conn:
            await conn.execute("begin")
            await conn.execute("select set_config('harbor.probe', 'dropped', false)")
            raise RuntimeError("the caller failed")
    assert await _probe(single) in (None, "")


async def test_an_idle_connection_goes_back_as_it_was(single: Database) -> None:
    async with single.autocommit() as conn:
        await conn.execute("select set_config('harbor.probe', 'session', false)")
        assert conn.info.transaction_status == IDLE
    assert await _probe(single) == "session"
    # and the one-round-trip calls, which leave it idle too, keep working on it
    rows = await single.fetch_in_one_round_trip(
        OWNER, "select current_setting('harbor.tenant_id') as t where %(x)s::int = 1", {"x": 1}
    )
    assert rows == [{"t": "t1"}]
    assert await _probe(single) == "session"
