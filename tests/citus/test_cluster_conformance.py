"""The store conformance suite against the Citus cluster (as against one server)."""

from __future__ import annotations

import psycopg

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.testing.conformance import MemoryStoreConformance
from tests.citus.conftest import ClusterDatabase


class TestCitusStores(MemoryStoreConformance):
    async def make_manager(self) -> MemoryManager:
        cluster_db: ClusterDatabase = self.request.getfixturevalue("cluster_db")
        # each conformance test expects a store with nothing of its owners in it
        with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
            conn.execute(
                "truncate harbor.memory_hits, harbor.memory_embeddings, harbor.memories,"
                " harbor.messages,"
                " harbor.working_state, harbor.session_state, harbor.owner_locks"
            )
        database = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=4)
        await database.open()
        assert database.set_local
        return MemoryManager.from_database(database)

    async def close_manager(self, manager: MemoryManager) -> None:
        await manager.close()
        assert manager.database is not None
        await manager.database.close()
