"""The caller's expiry sweep on one server (PostgresLongTermStore.expire_memories:
harbor.expire_memories() as the application role), in one round trip: it closes the
caller's own memories past their expiry, each at its expiry, and not another user's nor
one still to expire. (On Citus the same sweep is one delegated call:
tests/citus/test_cluster_expire_delegated.py.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory, MemoryScope
from harbor_pg.tiers.long_term import PostgresLongTermStore
from tests.conftest import PgDatabase
from tests.roundtrips import RoundTripProxy

ANN = MemoryOwner(tenant_id="t1", principal_id="ann", session_id="s1")
CARL = MemoryOwner(tenant_id="t1", principal_id="carl", session_id="s1")
DAY = timedelta(days=1)


async def test_the_sweep_closes_the_callers_expired_memories_in_one_round_trip(
    counted: tuple[Database, RoundTripProxy], fresh_db: PgDatabase
) -> None:
    db, proxy = counted
    manager = MemoryManager.from_database(db)
    now = datetime.now(UTC)

    async def save(owner: MemoryOwner, text: str, expires_at: datetime) -> str:
        memory = Memory(
            content=text, scope=MemoryScope.USER, valid_from=now - 2 * DAY, expires_at=expires_at
        )
        return (await manager.save(owner, memory)).memory.id

    expired = [await save(ANN, f"ann: expired {i}", now - DAY) for i in range(2)]
    current = await save(ANN, "ann: expires next year", now + 365 * DAY)
    carls = await save(CARL, "carl: expired, not ann's", now - DAY)
    store = PostgresLongTermStore(db)
    proxy.reset()
    assert await store.expire_memories(ANN) == 2
    assert proxy.flights == 1
    assert await store.expire_memories(ANN) == 0
    with psycopg.connect(fresh_db.superuser_url) as conn:
        rows = {
            memory_id: (is_open, at_expiry)
            for memory_id, is_open, at_expiry in conn.execute(
                "select id, upper_inf(valid), upper(valid) = expires_at from harbor.memories"
                " where id = any (%s)",
                ([*expired, current, carls],),
            ).fetchall()
        }
    assert [rows[i] for i in expired] == [(False, True)] * 2
    assert rows[current][0] and rows[carls][0]
