"""Moving a tenant's shard to the other worker, and isolating a tenant to a shard of
its own, while a writer and a reader run: nothing lost or doubled, recall the same."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import Database, local_identity
from harbor_pg.errors import MemoryError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from tests.citus.conftest import ClusterDatabase

MOVER = MemoryOwner(tenant_id="move-t1", principal_id="mia", session_id="s1")
ISOLATED = MemoryOwner(tenant_id="isolate-t1", principal_id="mia", session_id="s1")


def _conn(url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url)
    return conn


def _in_identity(conn: psycopg.Connection[Any], owner: MemoryOwner) -> None:
    for command in local_identity(owner):
        conn.execute(command)


def _write(url: str, n: int, owner: MemoryOwner = MOVER) -> None:
    with _conn(url) as conn:
        _in_identity(conn, owner)
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) values (%s, 'user', 'mia', 'mia', %s, md5(%s) || md5(%s))",
            (owner.tenant_id, f"mia note {n}", str(n), str(n)),
        )


def _read(url: str, owner: MemoryOwner = MOVER) -> list[str]:
    with _conn(url) as conn:
        _in_identity(conn, owner)
        rows = conn.execute(
            "select content from harbor.memories where tenant_id = %s order by content",
            (owner.tenant_id,),
        ).fetchall()
    return [r[0] for r in rows]


def _recall(url: str, owner: MemoryOwner, as_of: Any) -> list[tuple[Any, ...]]:
    """recall()'s ranked answer for one question, as of a fixed time."""
    with _conn(url) as conn:
        _in_identity(conn, owner)
        return conn.execute(
            "select id, content, score from harbor.recall('mia note 7', top_k => 10, as_of => %s)",
            (as_of,),
        ).fetchall()


def _shard_of(cluster_db: ClusterDatabase, tenant: str) -> tuple[int, str, str]:
    with psycopg.connect(cluster_db.superuser_url) as conn:
        row = conn.execute(
            "select shardid, shardminvalue, shardmaxvalue from pg_dist_shard"
            " where shardid = get_shard_id_for_distribution_column('harbor.memories', %s::text)",
            (tenant,),
        ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1]), str(row[2])


@pytest.mark.parametrize("operation", ["move", "isolate"])
def test_a_tenant_moves_or_is_isolated_losing_and_duplicating_nothing(
    cluster_db: ClusterDatabase, operation: str
) -> None:
    # a writer and a reader keep calling the facade (save, search, recall) while the tenant's
    # shard moves to the other worker, or the tenant is isolated to a shard of its own;
    # a statement planned against the replaced shard fails in Citus ("could not find
    # valid entry for shard") and the facade runs it again: no call fails
    owner = MOVER if operation == "move" else ISOLATED
    url = cluster_db.app_url
    for n in range(50):
        _write(url, n, owner)
    before = _read(url, owner)
    with psycopg.connect(cluster_db.superuser_url) as conn:
        as_of = conn.execute("select now()").fetchone()[0]  # type: ignore[index]
    recalled = _recall(url, owner, as_of)
    assert recalled and recalled[0][1] == "mia note 7"
    source = cluster_db.node_of(owner.tenant_id)
    target = next(w for w in cluster_db.cluster.workers if w.port != source.port)
    shard_before = _shard_of(cluster_db, owner.tenant_id)
    written = list(range(50))
    errors: list[BaseException] = []
    reads: list[int] = []

    def relocate() -> None:
        with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
            if operation == "move":
                conn.execute(
                    "select citus_move_shard_placement("
                    " get_shard_id_for_distribution_column('harbor.memories', %s::text),"
                    " %s, %s, %s, %s, shard_transfer_mode => 'block_writes')",
                    (owner.tenant_id, source.host, source.port, target.host, target.port),
                )
            else:
                conn.execute(
                    "select isolate_tenant_to_new_shard('harbor.memories', %s::text,"
                    " cascade_option => 'CASCADE', shard_transfer_mode => 'block_writes')",
                    (owner.tenant_id,),
                )

    async def under_load() -> None:
        db = Database(url, cluster_db.admin_url, min_size=1, max_size=4)
        await db.open()
        manager = MemoryManager.from_database(db)
        stop = asyncio.Event()

        async def writer() -> None:
            n = 50
            while not stop.is_set():
                try:
                    await manager.save(owner, Memory(content=f"mia note {n}"))
                    written.append(n)
                except MemoryError as exc:
                    errors.append(exc)
                n += 1

        async def reader() -> None:
            while not stop.is_set():
                try:
                    seen = [m.content for m in await manager.search(owner, "mia", limit=5000)]
                    assert len(seen) == len(set(seen))
                    reads.append(len(seen))
                    # recall, one call delegated to the tenant's worker: never empty (a
                    # call that reached the shard's old node is sent again)
                    recalled = await manager.recall(owner, "mia note")
                    assert recalled and all(m.content.startswith("mia") for m in recalled)
                except MemoryError as exc:
                    errors.append(exc)

        tasks = [asyncio.create_task(writer()), asyncio.create_task(reader())]
        try:
            await asyncio.sleep(0.3)
            # (no reader may hang: each call is bounded by the wait below)
            await asyncio.wait_for(asyncio.to_thread(relocate), timeout=120)
            await asyncio.sleep(0.3)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
            await manager.close()
            await db.close()

    asyncio.run(under_load())
    assert errors == []
    if operation == "move":
        assert cluster_db.node_of(owner.tenant_id).port == target.port
    else:
        shard, low, high = _shard_of(cluster_db, owner.tenant_id)
        assert shard != shard_before[0] and low == high  # a shard of one hash value
    after = _read(url, owner)
    expected = sorted(f"mia note {n}" for n in written)
    assert after == expected  # nothing lost, nothing doubled
    assert set(before) <= set(after)
    assert reads and all(r >= len(before) for r in reads)
    # the same question as of the same time: the same ranked answer
    assert _recall(url, owner, as_of) == recalled
    # the moved shard has the trigger that stands for ON DELETE SET NULL (Citus makes a
    # shard's triggers where it moves it): deleting a version another links to works
    with _conn(url) as conn:
        _in_identity(conn, owner)
        linking = conn.execute(
            "update harbor.memories m set valid = tstzrange(lower(m.valid), now()),"
            " superseded_by = n.id from harbor.memories n"
            " where m.tenant_id = %s and n.tenant_id = m.tenant_id"
            "   and m.content = 'mia note 0' and n.content = 'mia note 1'",
            (owner.tenant_id,),
        ).rowcount
        conn.execute(
            "delete from harbor.memories where tenant_id = %s and content = 'mia note 1'",
            (owner.tenant_id,),
        )
        linked = conn.execute(
            "select superseded_by from harbor.memories where tenant_id = %s"
            " and content = 'mia note 0'",
            (owner.tenant_id,),
        ).fetchall()
    assert linking == 1 and linked == [(None,)]
