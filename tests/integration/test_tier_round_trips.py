"""Single-statement tier calls in one database round trip each, counted on the wire."""

from __future__ import annotations

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.roundtrips import RoundTripProxy

ALICE = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1", run_id="r1")


async def test_reads_are_one_round_trip_each(counted: tuple[Database, RoundTripProxy]) -> None:
    db, proxy = counted
    manager = MemoryManager.from_database(db)
    await manager.update(ALICE, {"step": 1}, ttl_seconds=60)
    saved = await manager.save(ALICE, Memory(content="Alice works on the ingest pipeline"))
    assert saved.memory is not None
    await manager.append(ALICE, ConversationMessage(role="user", content="hello"))
    memories = PostgresLongTermStore(db)
    turns = PostgresShortTermStore(db)
    calls = {
        "scratch": lambda: manager.scratch(ALICE),
        "get": lambda: memories.get(ALICE, saved.memory.id),  # type: ignore[union-attr]
        "search": lambda: memories.search(ALICE, "ingest"),
        "load_summary": lambda: memories.load_summary(ALICE),
        "count": lambda: turns.count(ALICE),
        "after": lambda: turns.after(ALICE, 0, 10),
    }
    expected = {
        "scratch": {"step": 1},
        "count": 1,
        "load_summary": None,
    }
    for _ in range(6):  # past psycopg preparing the statements on their fifth use
        for name, call in calls.items():
            proxy.reset()
            got = await call()
            assert proxy.flights == 1, name
            if name in expected:
                assert got == expected[name], name
    got_memory = await memories.get(ALICE, saved.memory.id)
    assert got_memory is not None and got_memory.content == "Alice works on the ingest pipeline"
    assert [m.content for m in await memories.search(ALICE, "ingest")] == [
        "Alice works on the ingest pipeline"
    ]
    assert [t.content for t in await turns.after(ALICE, 0, 10)] == ["hello"]
