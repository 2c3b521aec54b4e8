"""The store conformance suite against the Citus cluster (as against one server)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.testing.conformance import MemoryStoreConformance
from tests.citus.conftest import ClusterDatabase


class TestCitusStores(MemoryStoreConformance):
    @pytest_asyncio.fixture
    async def manager(self, cluster_db: ClusterDatabase) -> AsyncIterator[MemoryManager]:
        database = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=4)
        await database.open()
        assert database.set_local
        manager = MemoryManager.from_database(database)
        try:
            yield manager
        finally:
            await manager.close()
            await database.close()
