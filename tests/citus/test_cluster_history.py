"""On the cluster, the facade's history of a memory (its supersession chain) answers as on
one server: Citus plans memory_history's recursive CTEs only with one value of the
distribution column, so the chain is read for the caller's tenant, then for the global
memories (a chain never leaves its tenant). A get reads the same way, one shard at a
time."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from tests.citus.conftest import ClusterDatabase
from tests.citus.test_cluster_routing import _facade_commands, _queries

ANN = MemoryOwner(tenant_id="history-a", principal_id="ann", session_id="s1")
BOB = MemoryOwner(tenant_id="history-b", principal_id="bob", session_id="s1")


def _chain(conn: psycopg.Connection, tenant: str, scope: str, user: str, texts: list[str]) -> None:
    """Memories ``texts`` of one owner key, each superseded by the next (the last current)."""
    ids = [f"{tenant or 'global'}-{i}" for i in range(len(texts))]
    # (the newest first: a memory's superseded_by names a stored one)
    for i, text in reversed(list(enumerate(texts))):
        current = i == len(texts) - 1
        conn.execute(
            "insert into harbor.memories (tenant_id, id, scope, user_id, principal_id, content,"
            " content_hash, valid, superseded_by) values (%s, %s, %s, %s, %s, %s,"
            " md5(%s) || md5(%s), tstzrange(now() - make_interval(days => %s),"
            " case when %s then null else now() - make_interval(days => %s) end, '[)'), %s)",
            (
                tenant,
                ids[i],
                scope,
                user,
                user or "admin",
                text,
                text,
                text,
                10 - i,
                current,
                9 - i,
                None if current else ids[i + 1],
            ),
        )


@pytest.fixture(scope="module")
def stored(cluster_db: ClusterDatabase) -> ClusterDatabase:
    with psycopg.connect(cluster_db.superuser_url) as conn:
        _chain(conn, "history-a", "user", "ann", ["ann: first", "ann: second", "ann: third"])
        _chain(conn, "history-b", "user", "bob", ["bob: first", "bob: second"])
        _chain(conn, "", "global", "", ["global: first", "global: second"])
    return cluster_db


def _history(db: ClusterDatabase, owner: MemoryOwner, memory_id: str) -> list[str]:
    async def run() -> list[str]:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        try:
            return [m.content for m in await manager.history(owner, memory_id)]
        finally:
            await manager.close()
            await database.close()

    return asyncio.run(run())


@pytest.mark.parametrize("memory_id", ["history-a-0", "history-a-1", "history-a-2"])
def test_a_memorys_history_is_its_chain_from_any_link(
    stored: ClusterDatabase, memory_id: str
) -> None:
    assert _history(stored, ANN, memory_id) == ["ann: first", "ann: second", "ann: third"]


def test_a_global_memorys_history_is_read_from_the_global_shard(stored: ClusterDatabase) -> None:
    assert _history(stored, ANN, "global-1") == ["global: first", "global: second"]


def test_another_tenants_memory_has_no_history_for_the_caller(stored: ClusterDatabase) -> None:
    assert _history(stored, ANN, "history-b-1") == []


def _get(db: ClusterDatabase, owner: MemoryOwner, memory_id: str) -> tuple[Any, list[int]]:
    """The facade's get of ``memory_id``, and the nodes its statements reached, in order."""
    found: list[Any] = []

    async def run(manager: MemoryManager) -> None:
        found.append(await manager.get(owner, memory_id))

    sent = asyncio.run(_facade_commands(db, run))
    return found[0], [port for port, _command in _queries(sent)]


def test_a_get_reads_the_callers_shard_then_the_global_one(stored: ClusterDatabase) -> None:
    tenant, shared = stored.node_of("history-a").port, stored.node_of("").port
    own, reached = _get(stored, ANN, "history-a-2")
    assert own is not None and own.content == "ann: third"
    assert reached == [tenant]
    global_memory, reached = _get(stored, ANN, "global-1")
    assert global_memory is not None and global_memory.content == "global: second"
    assert reached == [tenant, shared]
    missing, reached = _get(stored, ANN, "history-b-1")  # another tenant's: not found
    assert missing is None and reached == [tenant, shared]
