"""harbor_pg.tables: an application's own SQLAlchemy engine, under row-level security.

Rows are written only through what harbor_app may do (the manager, and the
SQLAlchemy session itself); reads go through SQLAlchemy Core as harbor_app.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator

import pytest
import sqlalchemy.exc
from sqlalchemy import Engine, create_engine, insert, pool, select
from sqlalchemy.orm import Session, sessionmaker

from harbor_pg import Memory, MemoryManager, MemoryOwner, MemoryScope
from harbor_pg.db.connection import Database
from harbor_pg.db.migrate import _sqlalchemy_url
from harbor_pg.tables import bind_identity, memories, messages, metadata, reflect, set_identity
from tests.conftest import PgDatabase

ALICE = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1")
BOB = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="bob", session_id="s1")
current: contextvars.ContextVar[MemoryOwner | None] = contextvars.ContextVar("caller")


@pytest.fixture
def engine(fresh_db: PgDatabase) -> Iterator[Engine]:
    # one pooled connection, so every transaction below reuses the same session
    eng = create_engine(_sqlalchemy_url(fresh_db.app_url), poolclass=pool.QueuePool, pool_size=1)
    yield eng
    eng.dispose()


async def _seed(fresh_db: PgDatabase) -> None:
    db = Database(fresh_db.app_url, fresh_db.admin_url, min_size=1, max_size=2)
    await db.open()
    manager = MemoryManager.from_database(db)
    await manager.save(ALICE, Memory(content="alice likes green tea", scope=MemoryScope.USER))
    await manager.save(BOB, Memory(content="bob likes coffee", scope=MemoryScope.USER))
    await manager.save(ALICE, Memory(content="p1 ships on fridays", scope=MemoryScope.PROJECT))
    await manager.close()
    await db.close()


def _contents(session: Session) -> list[str]:
    return sorted(session.execute(select(memories.c.content)).scalars())


async def test_sessions_see_what_their_caller_may_see(fresh_db: PgDatabase, engine: Engine) -> None:
    await _seed(fresh_db)
    sessions = sessionmaker(engine)
    bind_identity(sessions, current.get)
    token = current.set(ALICE)
    try:
        with sessions() as session:
            assert _contents(session) == ["alice likes green tea", "p1 ships on fridays"]
        current.set(BOB)
        with sessions() as session:
            assert _contents(session) == ["bob likes coffee", "p1 ships on fridays"]
        current.set(None)
        with sessions() as session:  # no identity: the policies show nothing
            assert _contents(session) == []
    finally:
        current.reset(token)


async def test_identity_lasts_one_transaction(fresh_db: PgDatabase, engine: Engine) -> None:
    await _seed(fresh_db)
    with engine.begin() as conn:
        set_identity(conn, ALICE)
        first = conn.execute(select(memories.c.content)).scalars().all()
    assert "alice likes green tea" in first
    with engine.begin() as conn:  # same pooled connection, next transaction
        assert conn.execute(select(memories.c.content)).scalars().all() == []
    with Session(engine) as session, session.begin():
        set_identity(session, BOB)
        assert "bob likes coffee" in _contents(session)


async def test_writes_are_held_to_the_callers_own_rows(engine: Engine) -> None:
    turn = {"tenant_id": "t1", "project_id": "p1", "user_id": "alice", "session_id": "s1"}
    turn["role"] = "user"
    with engine.begin() as conn:
        set_identity(conn, ALICE)
        conn.execute(insert(messages).values(**turn, content="hello", principal_id="alice"))
    with (
        pytest.raises(sqlalchemy.exc.DBAPIError, match="row-level security"),
        engine.begin() as conn,
    ):
        set_identity(conn, ALICE)
        conn.execute(insert(messages).values(**{**turn, "user_id": "bob"}, content="forged"))
    with engine.begin() as conn:
        set_identity(conn, BOB)
        assert conn.execute(select(messages.c.content)).scalars().all() == []
        set_identity(conn, ALICE)
        assert conn.execute(select(messages.c.content)).scalars().all() == ["hello"]


def test_the_tables_match_the_database(engine: Engine) -> None:
    found = reflect(engine)
    for table in metadata.sorted_tables:
        live = found.tables[f"harbor.{table.name}"]
        assert [c.name for c in table.columns] == [c.name for c in live.columns], table.name
        assert [c.name for c in table.primary_key] == [c.name for c in live.primary_key]
        for column in table.columns:
            assert column.nullable == live.columns[column.name].nullable, (table.name, column.name)
