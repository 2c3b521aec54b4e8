"""While the database is down calls fail fast; a restarted server costs no call;
recall and the context builder still never fail the turn; an unclosed manager
does not hang the process at exit.

These tests stop and start a server of their own (the session's is shared).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from psycopg import conninfo

from harbor_pg import ConversationMessage, MemoryManager, MemoryOwner
from harbor_pg.db import migrate, server
from harbor_pg.db.connection import DEFAULT_TIMEOUT, Database
from harbor_pg.errors import MemoryDatabaseError
from tests.conftest import PgServer

OWNER = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1")


@dataclass
class OwnServer:
    data: Path
    app_url: str
    admin_url: str

    @property
    def pgdata(self) -> Path:
        return self.data / "pgdata"

    def stop(self) -> None:
        server.stop_embedded(self.pgdata)

    def start(self) -> None:
        server.start_embedded(self.data)


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory, pg_server: PgServer) -> Iterator[OwnServer]:
    data = tmp_path_factory.mktemp("outage")
    su = server.start_embedded(data)
    server.bootstrap(su)
    base = conninfo.make_conninfo(su, dbname=server.DATABASE)
    migrate.upgrade(conninfo.make_conninfo(base, user=server.OWNER_ROLE))
    yield OwnServer(
        data,
        conninfo.make_conninfo(base, user=server.APP_ROLE),
        conninfo.make_conninfo(base, user=server.ADMIN_ROLE),
    )
    server.stop_embedded(data / "pgdata")


@pytest_asyncio.fixture
async def up(own: OwnServer) -> AsyncIterator[OwnServer]:
    """The server, running at the start and at the end of the test."""
    own.start()
    try:
        yield own
    finally:
        own.start()


async def _open(own: OwnServer, **options: float) -> Database:
    db = Database(own.app_url, own.admin_url, **options)  # type: ignore[arg-type]
    await db.open()
    return db


async def test_a_call_fails_within_the_timeout_while_the_server_is_down(up: OwnServer) -> None:
    os.environ.pop("HARBOR_DATABASE_TIMEOUT", None)
    db = await _open(up)
    manager = MemoryManager.from_database(db)
    try:
        await manager.append(OWNER, ConversationMessage(role="user", content="before"))
        up.stop()
        for _ in range(2):  # the first meets the dead connection, the second the empty pool
            t0 = time.perf_counter()
            with pytest.raises(MemoryDatabaseError, match="database unavailable"):
                await manager.recent(OWNER)
            assert time.perf_counter() - t0 < DEFAULT_TIMEOUT + 2.0
    finally:
        up.start()
        await db.close()


async def test_the_timeout_is_configurable(up: OwnServer) -> None:
    db = await _open(up, timeout=1.0)
    try:
        up.stop()
        t0 = time.perf_counter()
        with pytest.raises(MemoryDatabaseError):
            await MemoryManager.from_database(db).recent(OWNER)
        assert time.perf_counter() - t0 < 2.5
    finally:
        up.start()
        await db.close()


async def test_a_restart_between_calls_costs_no_call(up: OwnServer) -> None:
    db = await _open(up, min_size=3, max_size=3)
    manager = MemoryManager.from_database(db)
    try:
        # three idle connections, all left from before the restart
        await asyncio.gather(*(manager.recent(OWNER) for _ in range(3)))
        up.stop()
        up.start()
        for i in range(5):
            await manager.append(OWNER, ConversationMessage(role="user", content=f"after {i}"))
            assert [m.content for m in await manager.recent(OWNER, 1)] == [f"after {i}"]
    finally:
        await db.close()


async def test_the_first_call_after_an_outage_succeeds_at_once(up: OwnServer) -> None:
    db = await _open(up, timeout=1.0)
    manager = MemoryManager.from_database(db)
    try:
        up.stop()
        down = time.perf_counter()
        # calls during an outage of some seconds: the pool keeps trying to reconnect
        while time.perf_counter() - down < 8.0:
            with pytest.raises(MemoryDatabaseError):
                await manager.recent(OWNER)
        up.start()
        t0 = time.perf_counter()
        await manager.recent(OWNER)
        assert time.perf_counter() - t0 < 1.0
    finally:
        await db.close()


async def test_recall_and_build_never_fail_the_turn_while_the_server_is_down(
    up: OwnServer,
) -> None:
    db = await _open(up, timeout=1.0)
    manager = MemoryManager.from_database(db)
    try:
        await manager.inject_memory(OWNER, "Dana owns the ingest pipeline")
        up.stop()
        t0 = time.perf_counter()
        assert await manager.recall(OWNER, "who owns ingest?") == ()
        context = await manager.context_builder().build(OWNER, "who owns ingest?")
        assert context.degraded
        assert time.perf_counter() - t0 < 10.0
    finally:
        up.start()
        await manager.close()
        await db.close()


_UNCLOSED = textwrap.dedent(
    """
    import asyncio, sys
    from harbor_pg import ConversationMessage, MemoryManager, MemoryOwner
    from harbor_pg.db import server
    from harbor_pg.db.connection import Database
    from pathlib import Path

    owner = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1")

    async def main():
        db = Database(sys.argv[1], min_size=2, max_size=4)
        await db.open()
        manager = MemoryManager.from_database(db)  # never closed
        await manager.append(owner, ConversationMessage(role="user", content="hi"))
        server.stop_embedded(Path(sys.argv[2]))
        server.start_embedded(Path(sys.argv[2]).parent)
        server.stop_embedded(Path(sys.argv[2]))
        await asyncio.gather(*(manager.recent(owner) for _ in range(4)),
                             return_exceptions=True)
        await manager.recent(owner)  # raises MemoryDatabaseError out of asyncio.run()

    asyncio.run(main())
    """
)


def test_an_unclosed_manager_does_not_hang_the_process_at_exit(own: OwnServer) -> None:
    own.start()
    try:
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", _UNCLOSED, own.app_url, str(own.pgdata)],
            env={**os.environ, "HARBOR_DATABASE_TIMEOUT": "1"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        elapsed = time.perf_counter() - t0
        assert "MemoryDatabaseError" in out.stderr, out.stderr
        assert out.returncode == 1
        assert elapsed < 30
    finally:
        own.start()


def _kill_server(own: OwnServer) -> None:
    import signal

    pid = int((own.pgdata / "postmaster.pid").read_text().splitlines()[0])
    os.kill(pid, signal.SIGKILL)


async def test_no_acknowledged_write_is_lost_when_the_server_is_killed(up: OwnServer) -> None:
    db = await _open(up, timeout=1.0, min_size=4, max_size=4)
    manager = MemoryManager.from_database(db)
    owners = [MemoryOwner(tenant_id="t9", principal_id=f"w{i}", session_id="k") for i in range(4)]
    turns: list[str] = []
    facts: list[str] = []

    async def writer(i: int) -> None:
        owner = owners[i]
        for n in range(10_000):
            try:
                if n % 3:
                    await manager.append(
                        owner, ConversationMessage(role="user", content=f"{i}:{n}")
                    )
                    turns.append(f"{i}:{n}")
                else:
                    await manager.inject_memory(owner, f"fact {i}:{n}")
                    facts.append(f"fact {i}:{n}")
            except MemoryDatabaseError:
                return

    try:
        tasks = [asyncio.create_task(writer(i)) for i in range(4)]
        await asyncio.sleep(1.5)
        _kill_server(up)
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert turns and facts
        up.start()
        import psycopg

        su = conninfo.make_conninfo(up.app_url, user="postgres")
        with psycopg.connect(su) as conn:
            stored = {r[0] for r in conn.execute("select content from harbor.messages")}
            current = [
                r[0]
                for r in conn.execute(
                    "select content from harbor.memories where tenant_id = 't9'"
                    " and upper_inf(valid)"
                )
            ]
        assert set(turns) <= stored  # every acknowledged turn survived
        assert set(facts) <= set(current)
        assert len(current) == len(set(current))  # no duplicate current row
    finally:
        up.start()
        await db.close()


async def test_an_erasure_killed_midway_is_all_or_nothing(up: OwnServer) -> None:
    import psycopg

    su = conninfo.make_conninfo(up.app_url, user="postgres")

    def counts() -> tuple[int, int]:
        with psycopg.connect(su) as conn:
            row = conn.execute(
                "select (select count(*) from harbor.messages where user_id = 'victim'),"
                " (select count(*) from harbor.memories where user_id = 'victim')"
            ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    with psycopg.connect(su, autocommit=True) as conn:
        conn.execute(
            "insert into harbor.messages (tenant_id, user_id, session_id, role, content)"
            " select 't8', 'victim', 's' || (g % 50), 'user', 'turn ' || g"
            " from generate_series(1, 4000) g"
        )
        conn.execute(
            "insert into harbor.memories (tenant_id, id, scope, user_id, content, content_hash,"
            " source, valid) select 't8', 'm' || g, 'user', 'victim', 'fact ' || g,"
            " encode(sha256(g::text::bytea), 'hex'), 'injected', tstzrange(now(), null)"
            " from generate_series(1, 2000) g"
        )
    full = counts()
    db = await _open(up, timeout=1.0)
    manager = MemoryManager.from_database(db)
    try:
        erase = asyncio.create_task(manager.erase("t8", user_id="victim"))
        await asyncio.sleep(0.05)
        _kill_server(up)
        # killed midway (or, on a fast machine, already done): never a part of it
        with contextlib.suppress(MemoryDatabaseError):
            await erase
        up.start()
        assert counts() in (full, (0, 0))
    finally:
        up.start()
        await db.close()


async def test_queued_jobs_outlive_a_server_restart(up: OwnServer) -> None:
    """Jobs queued before the server stops run after it is back: by a worker started
    later, and by one that was running through the restart."""
    from harbor_pg.manager import MemoryManagerConfig
    from tests.integration.test_jobs_append import TeaModel

    owner = MemoryOwner(tenant_id="t-jobs", principal_id="dana", session_id="s1")
    db = await _open(up, timeout=2.0)
    model = TeaModel()
    later = MemoryManagerConfig(jobs_in_process=False, job_poll_seconds=0.1)
    queueing = MemoryManager.from_database(db, extraction_model=model, config=later)
    try:
        await queueing.append(owner, ConversationMessage(role="user", content="I love green tea"))
        up.stop()
        up.start()
        await queueing.run_worker(wait=False)  # a worker started after the restart
        assert model.calls == 1
        running = MemoryManager.from_database(
            db, extraction_model=model, config=MemoryManagerConfig(job_poll_seconds=0.1)
        )
        await running.append(owner, ConversationMessage(role="user", content="coffee too"))
        await asyncio.wait_for(running.drain(), timeout=30)  # its in-process worker runs
        assert model.calls == 2
        up.stop()
        up.start()
        third = ConversationMessage(role="user", content="and green tea again")
        await running.append(owner, third)  # the restart costs no call
        await asyncio.wait_for(running.drain(), timeout=30)  # and its worker carries on
        assert model.calls == 3
        await running.close()
    finally:
        await queueing.close()
        await db.close()
