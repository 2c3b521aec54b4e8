"""Re-embedding on the cluster: the backfill's statements and recall's switch on a
distributed database."""

from __future__ import annotations

import psycopg

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from tests.citus.conftest import ClusterDatabase

DANA = MemoryOwner(tenant_id="reembed-t", principal_id="dana", session_id="s1")


async def test_a_tenant_is_backfilled_and_recall_switches_on_the_cluster(
    cluster_db: ClusterDatabase,
) -> None:
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
        conn.execute("delete from harbor.memories where tenant_id = 'reembed-t'")
    db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=4)
    await db.open()
    try:
        assert db.set_local
        old, new = HashingEmbedder(384), HashingEmbedder(256)
        before = MemoryManager.from_database(db, embedder=old)
        for i in range(5):
            await before.inject_memory(DANA, f"Dana keeps harbor fact {i}")
        await before.inject_memory(
            DANA, "Dana asked about the shed", context="What about it?", scope="session"
        )
        manager = MemoryManager.from_database(db, embedder=new, previous_embedder=old)
        manager.reembed_recheck_seconds = 0.0
        assert await manager.query_embedder(DANA) is old
        report = await manager.reembed("reembed-t", batch_size=2)
        assert (report.memories, report.vectors, report.missing) == (6, 7, 6)
        assert await manager.query_embedder(DANA) is new
        assert await manager.recall(DANA, "harbor fact")
        assert await manager.reembed("reembed-t") == (0, 0, 0)
    finally:
        await db.close()
