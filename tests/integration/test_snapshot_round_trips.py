"""snapshot() in one database round trip, counted on the wire (not timed)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from harbor_pg.db.connection import Database
from harbor_pg.errors import MemoryDatabaseError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory
from tests.conftest import PgDatabase
from tests.roundtrips import RoundTripProxy

ALICE = MemoryOwner(
    tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1", run_id="r1"
)


@pytest_asyncio.fixture
async def proxy(fresh_db: PgDatabase) -> AsyncIterator[RoundTripProxy]:
    rt = RoundTripProxy(fresh_db.app_url)
    await rt.start()
    try:
        yield rt
    finally:
        await rt.stop()


@pytest_asyncio.fixture
async def counted(proxy: RoundTripProxy, fresh_db: PgDatabase) -> AsyncIterator[Database]:
    """A one-connection pool whose every byte goes through the proxy."""
    db = Database(
        proxy.proxied(fresh_db.app_url), proxy.proxied(fresh_db.admin_url), min_size=1, max_size=1
    )
    await db.open()
    try:
        yield db
    finally:
        await db.close()


async def test_snapshot_is_one_round_trip(counted: Database, proxy: RoundTripProxy) -> None:
    manager = MemoryManager.from_database(counted)
    await manager.append(ALICE, ConversationMessage(role="user", content="hello"))
    await manager.update(ALICE, {"step": 1})
    await manager.save(ALICE, Memory(content="Alice works on the ingest pipeline"))
    # the counter itself: a plain transaction with a read costs more than one
    proxy.reset()
    await manager.clear_working(ALICE.model_copy(update={"run_id": "none"}))
    assert proxy.flights > 1
    # psycopg prepares a statement after its fifth use: cover both sides of that
    for _ in range(8):
        proxy.reset()
        snap = await manager.snapshot(ALICE, query="ingest pipeline")
        assert proxy.flights == 1
        assert [m.content for m in snap.recent] == ["hello"]
        assert snap.working_state == {"step": 1}
        assert [m.content for m in snap.memories] == ["Alice works on the ingest pipeline"]


async def test_a_failing_statement_rolls_back_and_frees_the_connection(
    counted: Database, proxy: RoundTripProxy
) -> None:
    manager = MemoryManager.from_database(counted)
    await manager.append(ALICE, ConversationMessage(role="user", content="hello"))
    proxy.reset()
    with pytest.raises(MemoryDatabaseError, match="division by zero"):
        # the identity is set, then the statement fails: the sync rolls both back
        await counted.fetch_in_one_round_trip(ALICE, "select 1 / 0 as boom")
    # the one pooled connection is usable again, outside any transaction
    snap = await manager.snapshot(ALICE)
    assert [m.content for m in snap.recent] == ["hello"]
    rows = await counted.fetch_in_one_round_trip(
        ALICE, "select current_setting('harbor.user_id', true) as who"
    )
    assert rows == [{"who": "alice"}]
    async with counted.autocommit() as conn:
        # is_local: the identity did not outlive its transaction
        row = await (
            await conn.execute("select current_setting('harbor.user_id', true) as who")
        ).fetchone()
    assert row is not None and not row["who"]
