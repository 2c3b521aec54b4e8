"""On the cluster, a turn queued with its jobs and a delegated append of the same
session keep the session's ids in the order the turns were stored."""

from __future__ import annotations

import psycopg

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from tests.citus.conftest import ClusterDatabase
from tests.integration.test_jobs_append import TeaModel

OWNER = MemoryOwner(tenant_id="jobs-order", principal_id="ann", session_id="s1")


async def test_queued_and_delegated_appends_keep_the_sessions_order(
    cluster_db: ClusterDatabase,
) -> None:
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
        conn.execute("delete from harbor.messages where tenant_id = %s", (OWNER.tenant_id,))
    databases = [
        Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=2) for _ in range(2)
    ]
    for database in databases:
        await database.open()
    queued = MemoryManager.from_database(
        databases[0],
        extraction_model=TeaModel(),
        config=MemoryManagerConfig(jobs_in_process=False),
    )
    plain = MemoryManager.from_database(databases[1])
    try:
        ids: list[int] = []
        for k in range(6):
            manager = queued if k % 2 else plain
            stored = await manager.append(
                OWNER, ConversationMessage(role="user", content=f"turn {k}: I like tea")
            )
            assert stored.id is not None
            ids.append(stored.id)
        # stored one after another: each id above the one before, whichever way it came
        assert ids == sorted(ids) and len(set(ids)) == 6
        recent = await plain.recent(OWNER)
        assert [m.content for m in recent] == [f"turn {k}: I like tea" for k in range(6)]
        # the queued turns have their extraction jobs, the others none
        with psycopg.connect(cluster_db.superuser_url) as conn:
            rows = conn.execute(
                "select (args->>'message_id')::bigint from harbor_jobs.procrastinate_jobs"
                " where task_name = 'harbor.extract_turn' and args->>'tenant_id' = %s",
                (OWNER.tenant_id,),
            ).fetchall()
        assert sorted(r[0] for r in rows) == [ids[1], ids[3], ids[5]]
    finally:
        for manager in (queued, plain):
            await manager.close()
        for database in databases:
            await database.close()
