"""The conformance suite against both implementations."""

from __future__ import annotations

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.testing import MemoryStoreConformance
from tests.conftest import PgDatabase


class TestInProcessStores(MemoryStoreConformance):
    async def make_manager(self) -> MemoryManager:
        return await MemoryManager.create(in_process=True)


class TestPostgresStores(MemoryStoreConformance):
    async def make_manager(self) -> MemoryManager:
        fresh: PgDatabase = self.request.getfixturevalue("fresh_db")
        database = Database(fresh.app_url, fresh.admin_url, min_size=1, max_size=4)
        await database.open()
        return MemoryManager.from_database(database)

    async def close_manager(self, manager: MemoryManager) -> None:
        await manager.close()  # background summaries scheduled by appends finish here
        assert manager.database is not None
        await manager.database.close()
