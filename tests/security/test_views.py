"""The SQL views show current memories and a memory's history, under the reader's policies.

Rows are written through the application's API (harbor_app); the views are
read as harbor_app with an identity set and as a role an administrator bound
to a user, never as their owner.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import sql
from psycopg.rows import dict_row

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from harbor_pg.tiers.long_term import PostgresLongTermStore
from tests.conftest import PgDatabase
from tests.security.conftest import connect, grant_option

DANA = MemoryOwner(tenant_id="t1", principal_id="dana", session_id="s1")
EVE = MemoryOwner(tenant_id="t1", principal_id="eve", session_id="s1")
VIEWS = ("current_memories", "memory_history")


@pytest.fixture
def bound_dana(fresh_db: PgDatabase) -> Iterator[str]:
    """A login role bound to Dana by an administrator."""
    name = f"harbor_test_views_{os.getpid()}"
    with connect(fresh_db.superuser_url, autocommit=True) as conn:
        conn.execute(sql.SQL("create role {} login").format(sql.Identifier(name)))
        conn.execute(
            sql.SQL("grant harbor_app to {}").format(sql.Identifier(name))
            + sql.SQL(grant_option(fresh_db))
        )
        conn.execute(
            sql.SQL("grant connect on database {} to {}").format(
                sql.Identifier(fresh_db.name), sql.Identifier(name)
            )
        )
    with connect(fresh_db.admin_url, autocommit=True) as conn:
        conn.execute("select harbor.set_identity('t1')")
        conn.execute("select harbor.bind_role(%s, 't1', user_id => 'dana')", (name,))
    yield name
    with connect(fresh_db.superuser_url, autocommit=True) as conn:
        conn.execute(sql.SQL("drop owned by {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("drop role {}").format(sql.Identifier(name)))


def read(url: str, query: str, identity: str | None = None) -> list[dict[str, Any]]:
    with connect(url, row_factory=dict_row) as conn:
        if identity is not None:
            conn.execute(identity)
        return conn.execute(query).fetchall()


async def fill(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    store = manager.long_term
    assert isinstance(store, PostgresLongTermStore)
    berlin = await manager.save(DANA, Memory(content="Dana lives in Berlin"))
    lisbon = await store.supersede(
        DANA, str(berlin.memory.id), Memory(content="Dana lives in Lisbon")
    )
    assert lisbon is not None
    porto = await store.supersede(
        DANA, str(lisbon.memory.id), Memory(content="Dana lives in Porto")
    )
    assert porto is not None
    await manager.save(DANA, Memory(content="Dana likes tea"))
    await manager.save(EVE, Memory(content="Eve lives in Oslo"))


async def test_views_show_current_memories_and_history_under_the_readers_policies(
    database: Database, fresh_db: PgDatabase, bound_dana: str
) -> None:
    await fill(database)
    as_app = (fresh_db.app_url, "select harbor.set_identity('t1', principal_id => 'dana')")
    as_bound = (fresh_db.url_for(bound_dana), None)
    for url, identity in (as_app, as_bound):
        current = read(url, "select content from harbor.current_memories order by 1", identity)
        assert [r["content"] for r in current] == ["Dana likes tea", "Dana lives in Porto"]
        history = read(
            url,
            "select version, content, valid_to is null as open, is_current"
            "  from harbor.memory_history h"
            " where chain_id = (select chain_id from harbor.memory_history"
            "                    where content = 'Dana lives in Lisbon')"
            " order by version",
            identity,
        )
        assert [(r["version"], r["content"], r["open"], r["is_current"]) for r in history] == [
            (1, "Dana lives in Berlin", False, False),
            (2, "Dana lives in Lisbon", False, False),
            (3, "Dana lives in Porto", True, True),
        ]
        everything = read(url, "select content from harbor.memory_history", identity)
        assert "Eve lives in Oslo" not in {r["content"] for r in everything}
    eve = "select harbor.set_identity('t1', principal_id => 'eve')"
    assert [
        r["content"]
        for r in read(fresh_db.app_url, "select content from harbor.current_memories", eve)
    ] == ["Eve lives in Oslo"]
    assert (
        read(
            fresh_db.app_url,
            "select content from harbor.memory_history where content like 'Dana%'",
            eve,
        )
        == []
    )
    # no identity: nothing
    assert read(fresh_db.app_url, "select * from harbor.current_memories") == []


def test_views_run_with_the_readers_rights(fresh_db: PgDatabase) -> None:
    rows = read(
        fresh_db.superuser_url,
        "select c.relname, c.reloptions from pg_class c"
        " where c.relnamespace = 'harbor'::regnamespace and c.relkind = 'v' order by 1",
    )
    assert {r["relname"]: r["reloptions"] for r in rows} == {
        v: ["security_invoker=true"] for v in VIEWS
    }
