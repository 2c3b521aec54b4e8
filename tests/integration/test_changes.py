"""Changes to memories are announced on their tenant's channel as they commit, and
MemoryManager.watch(owner) yields only what that owner may read, read back as it."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest
from psycopg import sql

from harbor_pg.changes import MemoryChange, MemoryWatch, change_channel
from harbor_pg.db.connection import Database
from harbor_pg.errors import MemoryConfigurationError, MemoryScopeError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from harbor_pg.tiers.facades import unwrap_store
from harbor_pg.tiers.in_process import InMemoryLongTermStore
from tests.conftest import PgDatabase

DANA = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s1")
ERIN = MemoryOwner(tenant_id="acme", principal_id="erin", session_id="s1")
MALLORY = MemoryOwner(tenant_id="evil", principal_id="mallory", session_id="s1")


async def _next(watch: MemoryWatch, seconds: float = 10.0) -> MemoryChange:
    return await asyncio.wait_for(anext(watch), timeout=seconds)


def test_the_channel_is_named_alike_in_python_and_sql(fresh_db: PgDatabase) -> None:
    tenants = ["acme", "", "t" * 200, "café ☕"]
    with psycopg.connect(fresh_db.app_url) as conn:
        named = [conn.execute("select harbor.change_channel(%s)", (t,)).fetchone() for t in tenants]
    assert named == [(change_channel(t),) for t in tenants]
    assert all(len(change_channel(t)) < 64 for t in tenants)  # a channel is an identifier


async def test_a_watch_yields_its_owners_changes_and_nothing_of_anyone_elses(
    database: Database,
) -> None:
    manager = MemoryManager.from_database(database)
    store = unwrap_store(manager.long_term)
    async with manager.watch(DANA) as changes:
        # another user of the tenant, and another tenant: announced, never yielded here
        await manager.save(ERIN, Memory(content="Erin's private note"))
        await manager.save(MALLORY, Memory(content="Mallory's note"))
        first = await manager.save(DANA, Memory(content="Dana prefers green tea"))
        change = await _next(changes)
        assert (change.kind, change.memory_id) == ("written", first.memory.id)
        assert change.memory is not None and change.memory.content == "Dana prefers green tea"

        successor = await store.supersede(
            DANA, str(first.memory.id), Memory(content="Dana prefers black tea")
        )
        got = {(c.kind, c.memory_id) for c in [await _next(changes), await _next(changes)]}
        assert got == {("superseded", first.memory.id), ("written", successor.memory.id)}

        # deleting the current version reopens the one it replaced: both are told
        assert await manager.delete(DANA, str(successor.memory.id))
        got = {(c.kind, c.memory_id) for c in [await _next(changes), await _next(changes)]}
        assert got == {("erased", successor.memory.id), ("superseded", first.memory.id)}

        # a batch is announced in chunks, every memory of it yielded
        saved = await manager.save_many(
            DANA, [Memory(content=f"Dana's fact number {i}") for i in range(150)]
        )
        ids = [await _next(changes) for _ in saved]
        assert {c.memory_id for c in ids} == {s.memory.id for s in saved}


async def test_a_rolled_back_write_is_not_announced(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(database)
    async with manager.watch(DANA) as changes:
        with psycopg.connect(fresh_db.app_url) as conn:
            conn.execute(
                "select harbor.set_identity('acme', principal_id => 'dana', is_local => true)"
            )
            conn.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
                " content_hash)"
                " values ('acme', 'user', 'dana', 'dana', 'never', md5('x') || md5('y'))"
            )
            conn.rollback()
        kept = await manager.save(DANA, Memory(content="Dana's kept note"))
        change = await _next(changes)
        assert change.memory_id == kept.memory.id


async def test_a_listener_learns_ids_and_kinds_only_and_a_forged_payload_yields_nothing(
    database: Database, fresh_db: PgDatabase
) -> None:
    """Mallory, of another tenant, listens on acme's channel and notifies on it, as any
    login may; what she hears holds no content, and what she sends moves no watch."""
    manager = MemoryManager.from_database(database)
    with psycopg.connect(fresh_db.app_url, autocommit=True) as mallory:
        mallory.execute(
            "select harbor.set_identity('evil', principal_id => 'mallory', session_id => 's1')"
        )
        mallory.execute(sql.SQL("listen {}").format(sql.Identifier(change_channel("acme"))))
        async with manager.watch(DANA) as changes:
            note = await manager.save(DANA, Memory(content="Dana's secret: the vault is blue"))
            assert (await _next(changes)).memory_id == note.memory.id
            heard = [n.payload for n in mallory.notifies(timeout=5, stop_after=1)]
            assert [json.loads(p) for p in heard] == [{"kind": "written", "ids": [note.memory.id]}]
            assert "vault" not in heard[0]
            # she reads none of it
            mallory.execute(
                "select harbor.set_identity('acme', principal_id => 'mallory', session_id => 's1')"
            )
            rows = mallory.execute(
                "select content from harbor.memories where id = %s", (note.memory.id,)
            ).fetchall()
            assert rows == []

            # forged: an erasure of a memory Dana still reads, a write of one she cannot
            # read, and noise; none of it is yielded
            erin = await manager.save(ERIN, Memory(content="Erin's own note"))
            for payload in (
                {"kind": "erased", "ids": [note.memory.id]},
                {"kind": "written", "ids": [erin.memory.id]},
                {"kind": "written", "ids": "not a list"},
                "not json",
            ):
                text = payload if isinstance(payload, str) else json.dumps(payload)
                mallory.execute("select pg_notify(%s, %s)", (change_channel("acme"), text))
            marker = await manager.save(DANA, Memory(content="Dana's next note"))
            change = await _next(changes)
            assert (change.kind, change.memory_id) == ("written", marker.memory.id)


async def test_watch_needs_the_postgres_stores_and_a_bound_manager_watches_only_its_owner(
    database: Database,
) -> None:
    with pytest.raises(MemoryConfigurationError):
        MemoryManager(long_term=InMemoryLongTermStore()).watch(DANA)
    bound = MemoryManager.from_database(database).bound_to(DANA)
    with pytest.raises(MemoryScopeError):
        bound.watch(ERIN)
