"""Reads from a hot standby of the embedded server, writes to the primary.

A primary and a standby (pg_basebackup + streaming replication) from the
embedded binaries, on loopback ports of their own, for this module. Pausing
the standby's replay shows where each read went: a read served by the standby
cannot see a write made after the pause.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg import errors

from harbor_pg.db import migrate, server
from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.testing.nodes import LocalNode, start_node, start_standby
from harbor_pg.tiers.replica import ReadReplica

ANN = MemoryOwner(tenant_id="rep-t1", principal_id="ann", session_id="s1")
BOB = MemoryOwner(tenant_id="rep-t2", principal_id="bob", session_id="s1")


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[LocalNode, LocalNode]]:
    base = Path(tempfile.mkdtemp(prefix="harbor-replica-"))
    nodes: list[LocalNode] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            primary = start_node(base, "primary")
            nodes.append(primary)
            server.bootstrap(primary.url())
            migrate.upgrade(primary.url("harbor", "harbor_owner"))
            standby = start_standby(primary, base, "standby")
            nodes.append(standby)
        yield primary, standby
    finally:
        for node in reversed(nodes):
            node.remove()
        shutil.rmtree(base, ignore_errors=True)


def _caught_up(primary: LocalNode, standby: LocalNode) -> None:
    with psycopg.connect(primary.url("harbor"), autocommit=True) as conn:
        lsn = conn.execute("select pg_current_wal_insert_lsn()").fetchone()[0]  # type: ignore[index]
    with psycopg.connect(standby.url("harbor"), autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while not conn.execute("select pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[
            0
        ]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the standby did not catch up"
            time.sleep(0.02)


def _replay(standby: LocalNode, on: bool) -> None:
    with psycopg.connect(standby.url("harbor"), autocommit=True) as conn:
        conn.execute("select pg_wal_replay_resume()" if on else "select pg_wal_replay_pause()")


@pytest_asyncio.fixture
async def manager(pair: tuple[LocalNode, LocalNode]) -> AsyncIterator[MemoryManager]:
    primary, standby = pair
    db = Database(primary.url("harbor", "harbor_app"), primary.url("harbor", "harbor_admin"))
    reader = Database(standby.url("harbor", "harbor_app"))
    await db.open()
    await reader.open()
    manager = MemoryManager.from_database(db)
    manager.replica = ReadReplica(reader)
    try:
        yield manager
    finally:
        _replay(standby, True)
        await manager.close()
        await db.close()
        await reader.close()


async def test_reads_go_to_the_standby_and_writes_to_the_primary(
    manager: MemoryManager, pair: tuple[LocalNode, LocalNode]
) -> None:
    primary, standby = pair
    assert manager.replica is not None
    manager.replica.fresh_seconds = 0  # no read-your-writes window: every read to the standby
    await manager.save(ANN, Memory(content="ann keeps the lighthouse key"))
    await manager.append(ANN, ConversationMessage(role="user", content="first turn"))
    _caught_up(primary, standby)
    assert [m.content for m in await manager.search(ANN, "lighthouse")] == [
        "ann keeps the lighthouse key"
    ]
    _replay(standby, False)
    await manager.save(ANN, Memory(content="ann also keeps the boathouse key"))
    await manager.append(ANN, ConversationMessage(role="user", content="second turn"))
    # the write reached the primary...
    with psycopg.connect(primary.url("harbor")) as conn:
        count = conn.execute(
            "select count(*) from harbor.memories where content like 'ann also%'"
        ).fetchone()
    assert count == (1,)
    # ...and every read came from the paused standby, which has not replayed it
    assert [m.content for m in await manager.search(ANN, "boathouse")] == []
    assert [m.content for m in await manager.recall(ANN, "boathouse key")] == [
        "ann keeps the lighthouse key"
    ]
    assert [t.content for t in await manager.recent(ANN)] == ["first turn"]
    snap = await manager.snapshot(ANN, "boathouse key")
    assert [t.content for t in snap.recent] == ["first turn"]
    assert [m.content for m in snap.memories] == ["ann keeps the lighthouse key"]
    _replay(standby, True)
    _caught_up(primary, standby)
    assert [t.content for t in await manager.recent(ANN)] == ["first turn", "second turn"]


async def test_an_owner_reads_its_own_last_write_at_once(
    manager: MemoryManager, pair: tuple[LocalNode, LocalNode]
) -> None:
    primary, standby = pair
    _caught_up(primary, standby)
    _replay(standby, False)
    owner = MemoryOwner(tenant_id="rep-t3", principal_id="cy", session_id="s1")
    await manager.append(owner, ConversationMessage(role="user", content="just said"))
    await manager.save(owner, Memory(content="cy just saved this"))
    # within the window after its write the owner reads from the primary
    assert [t.content for t in await manager.recent(owner)] == ["just said"]
    assert [m.content for m in await manager.search(owner, "saved")] == ["cy just saved this"]
    # an owner that did not write reads from the (paused) standby
    other = MemoryOwner(tenant_id="rep-t3", principal_id="dee", session_id="s1")
    assert manager.replica is not None and manager.replica.serves(other)
    assert not manager.replica.serves(owner)


def _as_app(url: str, owner: MemoryOwner | None) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url)
    if owner is not None:
        conn.execute(
            "select harbor.set_identity(%s, principal_id => %s, session_id => %s)",
            (owner.tenant_id, owner.principal_id, owner.session_id),
        )
    return conn


async def test_row_security_holds_on_the_standby(
    manager: MemoryManager, pair: tuple[LocalNode, LocalNode]
) -> None:
    primary, standby = pair
    await manager.save(BOB, Memory(content="bob's secret on the standby"))
    _caught_up(primary, standby)
    url = standby.url("harbor", "harbor_app")
    with _as_app(url, BOB) as conn:
        mine = conn.execute("select content from harbor.memories").fetchall()
    assert mine == [("bob's secret on the standby",)]
    for intruder in (ANN, None):
        with _as_app(url, intruder) as conn:
            seen = conn.execute(
                "select content from harbor.memories where tenant_id = 'rep-t2'"
            ).fetchall()
            assert seen == []
            rows = conn.execute(
                "select count(*) from harbor.recall('secret standby') where tenant_id = 'rep-t2'"
            ).fetchone()
            assert rows == (0,)
    with _as_app(url, BOB) as conn, pytest.raises(errors.ReadOnlySqlTransaction):
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) values ('rep-t2', 'user', 'bob', 'bob', 'x', repeat('b', 64))"
        )
