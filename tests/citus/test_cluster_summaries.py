"""The background summary's lease on the cluster (delegated calls, sql/citus/lease.sql):
taken by exactly one of concurrent callers, held until it expires or is finished, and
the session summarised end to end."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest_asyncio

from harbor_pg.context.summarizer import SessionSummarizer
from harbor_pg.db.connection import Database
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.tiers.long_term import PostgresLongTermStore
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.citus.conftest import ClusterDatabase
from tests.unit.test_builder_support import ScriptedModel, exchange

OWNER = MemoryOwner(tenant_id="lease-t", principal_id="lea", session_id="s1")


async def _open(cluster_db: ClusterDatabase) -> Database:
    db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=4)
    await db.open()
    assert db.set_local
    return db


@pytest_asyncio.fixture
async def pools(cluster_db: ClusterDatabase) -> AsyncIterator[tuple[Database, Database]]:
    """Two independent pools (two worker processes), the lease tenant's rows emptied."""
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
        for table in ("session_state", "messages", "memory_embeddings", "memories"):
            conn.execute(f"delete from harbor.{table} where tenant_id = 'lease-t'")
    first, second = await _open(cluster_db), await _open(cluster_db)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def test_the_lease_is_taken_once_held_and_finished(pools: tuple[Database, Database]) -> None:
    first, second = pools
    store, other = PostgresShortTermStore(first), PostgresShortTermStore(second)
    for message in exchange(10, words=5):
        await store.append(OWNER, message)
    too_few = await store.acquire_summary_lease(  # (20 turns)
        OWNER, min_turns=30, cooldown_seconds=0, lease_seconds=60
    )
    assert too_few is None
    leases = await asyncio.gather(
        *(
            s.acquire_summary_lease(OWNER, min_turns=20, cooldown_seconds=300, lease_seconds=1.5)
            for s in (store, other, store, other)
        )
    )
    taken = [lease for lease in leases if lease is not None]
    assert len(taken) == 1 and taken[0].turns == 20 and taken[0].turns_at_summary == 0
    await asyncio.sleep(1.6)  # the holder "crashed": its lease expires
    again = await other.acquire_summary_lease(
        OWNER, min_turns=20, cooldown_seconds=300, lease_seconds=60
    )
    assert again is not None
    assert await store.finish_summary_lease(OWNER, taken[0], turns_at_summary=20) is False
    assert await other.finish_summary_lease(OWNER, again, turns_at_summary=20) is True
    # the cooldown now holds the next lease back
    after = await store.acquire_summary_lease(
        OWNER, min_turns=1, cooldown_seconds=300, lease_seconds=60
    )
    assert after is None


async def test_a_session_is_summarised_on_the_cluster(pools: tuple[Database, Database]) -> None:
    first, _second = pools
    store = PostgresShortTermStore(first)
    for message in exchange(10, words=5):
        await store.append(OWNER, message)
    model = ScriptedModel()
    summariser = SessionSummarizer(
        policy=MemoryPolicy(),
        messages=store,
        memories=PostgresLongTermStore(first),
        model=model,
    )
    assert await summariser.maybe_summarise(OWNER) is True
    assert model.count("summary") == 1
    summary = await PostgresLongTermStore(first).load_summary(OWNER)
    assert summary is not None and summary.content
