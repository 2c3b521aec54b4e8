"""The conformance suite against both implementations."""

from __future__ import annotations

import pytest_asyncio

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.testing.conformance import MemoryStoreConformance


class TestInProcessStores(MemoryStoreConformance):
    @pytest_asyncio.fixture
    async def manager(self) -> MemoryManager:
        return await MemoryManager.create(in_process=True)


class TestPostgresStores(MemoryStoreConformance):
    @pytest_asyncio.fixture
    async def manager(self, database: Database) -> MemoryManager:
        return MemoryManager.from_database(database)
