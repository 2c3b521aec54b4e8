"""Moving a tenant's shard to the other worker while a writer and a reader run."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from harbor_pg.db.connection import local_identity
from harbor_pg.owner import MemoryOwner
from tests.citus.conftest import ClusterDatabase

MOVER = MemoryOwner(tenant_id="move-t1", principal_id="mia", session_id="s1")


def _conn(url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url)
    return conn


def _in_identity(conn: psycopg.Connection[Any]) -> None:
    for command in local_identity(MOVER):
        conn.execute(command)


def _write(url: str, n: int) -> None:
    with _conn(url) as conn:
        _in_identity(conn)
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) values (%s, 'user', 'mia', 'mia', %s, md5(%s) || md5(%s))",
            (MOVER.tenant_id, f"mia note {n}", str(n), str(n)),
        )


def _read(url: str) -> list[str]:
    with _conn(url) as conn:
        _in_identity(conn)
        rows = conn.execute(
            "select content from harbor.memories where tenant_id = %s order by content",
            (MOVER.tenant_id,),
        ).fetchall()
    return [r[0] for r in rows]


def test_a_tenant_moves_to_the_other_worker_losing_and_duplicating_nothing(
    cluster_db: ClusterDatabase,
) -> None:
    url = cluster_db.app_url
    for n in range(50):
        _write(url, n)
    before = _read(url)
    source = cluster_db.node_of(MOVER.tenant_id)
    target = next(w for w in cluster_db.cluster.workers if w.port != source.port)
    written = list(range(50))
    errors: list[BaseException] = []
    reads: list[int] = []
    stop = threading.Event()

    def writer() -> None:
        n = 50
        while not stop.is_set():
            try:
                _write(url, n)
                written.append(n)
            except psycopg.Error as exc:  # a write refused is not a write lost
                errors.append(exc)
            n += 1

    def reader() -> None:
        while not stop.is_set():
            try:
                seen = _read(url)
                assert len(seen) == len(set(seen))
                reads.append(len(seen))
            except psycopg.Error as exc:
                errors.append(exc)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.3)
        with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
            conn.execute(
                "select citus_move_shard_placement("
                " get_shard_id_for_distribution_column('harbor.memories', %s::text),"
                " %s, %s, %s, %s, shard_transfer_mode => 'block_writes')",
                (MOVER.tenant_id, source.host, source.port, target.host, target.port),
            )
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    assert cluster_db.node_of(MOVER.tenant_id).port == target.port
    after = _read(url)
    expected = sorted(f"mia note {n}" for n in written)
    assert after == expected  # nothing lost, nothing doubled
    assert set(before) <= set(after)
    assert reads and all(r >= len(before) for r in reads)
