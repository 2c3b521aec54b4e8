"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg.rows import dict_row

from harbor_pg.db.connection import Database
from tests.conftest import PgDatabase
from tests.roundtrips import RoundTripProxy, counted_database


@pytest_asyncio.fixture
async def counted(fresh_db: PgDatabase) -> AsyncIterator[tuple[Database, RoundTripProxy]]:
    """A one-connection Database on a fresh database, with its round trips counted."""
    async with counted_database(fresh_db.app_url, fresh_db.admin_url) as pair:
        yield pair


Conn = psycopg.Connection[Any]


@pytest.fixture
def conns(fresh_db: PgDatabase) -> Iterator[tuple[Conn, Conn]]:
    """A superuser connection and an application one (rows as dicts, identity t1 /
    u1 / session s1 for the session), both autocommit, on a fresh database."""
    su = psycopg.connect(fresh_db.superuser_url, autocommit=True)
    app = psycopg.connect(fresh_db.app_url, autocommit=True, row_factory=dict_row)
    app.execute("select harbor.set_identity('t1', principal_id => 'u1', session_id => 's1')")
    try:
        yield su, app
    finally:
        su.close()
        app.close()
