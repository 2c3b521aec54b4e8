"""Fact extraction's per-fact write: gate and write in one round trip, counted on the wire."""

from __future__ import annotations

import psycopg
from psycopg.types.json import Jsonb

from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory
from harbor_pg.tiers.long_term import PostgresLongTermStore
from tests.conftest import PgDatabase
from tests.roundtrips import RoundTripProxy

ALICE = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1")
EMBEDDER = HashingEmbedder()


async def _fact(
    store: PostgresLongTermStore, text: str, replaces: str | None = None
) -> tuple[str | None, bool, str | None]:
    vector = EMBEDDER.embed_sync(text)
    result = await store.add_fact(
        ALICE,
        Memory(content=text, scope=MemoryScope.USER),
        embedding=vector,
        model_id=EMBEDDER.model_id,
        dedup_threshold=0.9,
        replaces=replaces,
    )
    restated = result.restatement_of.memory_id if result.restatement_of else None
    return (result.memory.id if result.memory else None), result.created, restated


async def test_each_fact_outcome_is_one_round_trip(
    counted: tuple[Database, RoundTripProxy],
) -> None:
    db, proxy = counted
    store = PostgresLongTermStore(db)
    for i in range(6):  # past psycopg preparing the statements on their fifth use
        proxy.reset()
        first, created, _ = await _fact(store, f"Alice lives in city number {i} of the list")
        assert created and first is not None
        assert proxy.flights == 1
        proxy.reset()
        _, created, restated = await _fact(store, f"Alice lives in city number {i} of the list!")
        assert (created, restated) == (False, first)
        assert proxy.flights == 1
        proxy.reset()
        second, created, _ = await _fact(
            store, f"Alice moved to town {i}, far from everything", replaces=first
        )
        assert created and second is not None
        assert proxy.flights == 1
        old = await store.get(ALICE, first)
        assert old is not None and old.superseded_by == second


def test_the_gate_is_inlined_into_the_write(fresh_db: PgDatabase) -> None:
    """The similarity gate is part of the write statement's plan (no function call)."""
    vector = "[" + ",".join(str(x) for x in EMBEDDER.embed_sync("hello there")) + "]"
    params = {
        **ALICE.key(MemoryScope.USER),
        "scope": "user",
        "id": None,
        "principal_id": "alice",
        "memory_type": "fact",
        "importance": 0.5,
        "content": "hello there",
        "content_hash": "h",
        "context": None,
        "entity_ids": [],
        "source": "extracted",
        "sensitivity": "none",
        "source_session_id": None,
        "source_message_ids": [],
        "metadata": Jsonb({}),
        "valid_from": None,
        "model_id": EMBEDDER.model_id,
        "dims": EMBEDDER.dimensions,
        "embedding": vector,
        "dedup_threshold": 0.9,
        "exclude_ids": [],
        "replaces": "x",
    }
    with psycopg.connect(fresh_db.app_url) as conn:
        conn.execute("select harbor.set_identity('t1', principal_id => 'alice')")
        for name in ("extraction_insert_memory", "extraction_supersede_memory"):
            plan = "\n".join(
                row[0]
                for row in conn.execute("explain (verbose, costs off) " + query(name), params)
            )
            assert "nearest_current_memory" not in plan, plan
            assert "memory_embeddings" in plan, plan
        conn.rollback()
