"""The conformance suite against both implementations."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.testing.conformance import MemoryStoreConformance


class TestInProcessStores(MemoryStoreConformance):
    @pytest_asyncio.fixture
    async def manager(self) -> AsyncIterator[MemoryManager]:
        manager = await MemoryManager.create(in_process=True)
        yield manager
        await manager.close()  # background summaries scheduled by appends finish here


class TestPostgresStores(MemoryStoreConformance):
    @pytest_asyncio.fixture
    async def manager(self, database: Database) -> AsyncIterator[MemoryManager]:
        manager = MemoryManager.from_database(database)
        yield manager
        await manager.close()  # before the database fixture closes the pools
