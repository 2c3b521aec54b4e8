"""MemoryRecall in one database round trip, counted on the wire (not timed)."""

from __future__ import annotations

from harbor_pg.context.recall import MemoryRecall
from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from tests.roundtrips import RoundTripProxy

ALICE = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1")


async def test_hybrid_recall_is_one_round_trip(counted: tuple[Database, RoundTripProxy]) -> None:
    db, proxy = counted
    manager = MemoryManager.from_database(db, embedder=HashingEmbedder())
    await manager.save(ALICE, Memory(content="Alice works on the ingest pipeline"))
    await manager.save(ALICE, Memory(content="Bob reviews the billing service"))
    recaller = manager.recaller()
    assert isinstance(recaller, MemoryRecall)
    for _ in range(8):  # both sides of psycopg preparing the statement on its fifth use
        proxy.reset()
        scored = await recaller.recall_scored(ALICE, "who works on ingest?")
        assert proxy.flights == 1
        assert scored[0].memory.content == "Alice works on the ingest pipeline"
        assert scored[0].dense_rank == 1 and scored[0].lexical_rank == 1
