"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from harbor_pg.db.connection import Database
from tests.conftest import PgDatabase
from tests.roundtrips import RoundTripProxy, counted_database


@pytest_asyncio.fixture
async def counted(fresh_db: PgDatabase) -> AsyncIterator[tuple[Database, RoundTripProxy]]:
    """A one-connection Database on a fresh database, with its round trips counted."""
    async with counted_database(fresh_db.app_url, fresh_db.admin_url) as pair:
        yield pair
