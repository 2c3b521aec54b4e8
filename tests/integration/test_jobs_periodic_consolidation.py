"""The periodic consolidation: a worker so configured consolidates every owner with
memories written since its last run, however they were written, each as that owner."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

import psycopg

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.jobs import CONSOLIDATE_TASK, CONSOLIDATION_SCAN_TASK
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from tests.conftest import PgDatabase
from tests.integration.test_jobs_append import jobs

DANA = MemoryOwner(tenant_id="acme", principal_id="dana")
ERIN = MemoryOwner(tenant_id="acme", principal_id="erin")
BOB = MemoryOwner(tenant_id="acme", principal_id="bob")
OTTO = MemoryOwner(tenant_id="other", principal_id="otto", project_id="p1")
TEAS = ("Dana likes oolong tea.", "dana likes OOLONG tea!")


def rows_of(db: PgDatabase, user_id: str) -> list[tuple[str, bool]]:
    """Every memory row of ``user_id`` (content, current), whatever its state."""
    with psycopg.connect(db.superuser_url) as conn:
        rows = conn.execute(
            "select content, upper_inf(valid) and superseded_by is null"
            " from harbor.memories where user_id = %s order by content, 2",
            (user_id,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def merged(rows: list[tuple[str, bool]]) -> bool:
    """Whether ``rows`` are Dana's two restatements, closed, and one successor of them."""
    current = [c for c, now in rows if now]
    return len(rows) == 3 and len(current) == 1 and current[0] in TEAS


async def test_a_worker_merges_memories_saved_directly_without_being_asked(
    database: Database, fresh_db: PgDatabase
) -> None:
    config = MemoryManagerConfig(
        jobs_in_process=False,
        # every minute: a worker starting defers the minute just begun at once
        consolidation_cron="* * * * *",
    )
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder(), config=config)
    await manager.save_many(DANA, [Memory(content=text) for text in TEAS])
    await manager.save(ERIN, Memory(content="Erin rides to work"))
    # a project memory and its restatement, of another tenant
    project = [
        Memory(content="The deploy runs on Fridays", scope="project"),
        Memory(content="the deploy runs on fridays!", scope="project"),
    ]
    await manager.save_many(OTTO, project)
    # an erased user's restatements: erased before the worker runs
    await manager.save_many(
        BOB, [Memory(content="Bob likes tea."), Memory(content="bob likes TEA")]
    )
    await manager.erase("acme", user_id="bob")
    assert jobs(fresh_db, CONSOLIDATE_TASK) == []
    worker = asyncio.get_running_loop().create_task(
        manager.job_runner().run_worker(install_signal_handlers=False)
    )

    def done() -> bool:
        scans = [s for _t, _a, s in jobs(fresh_db, CONSOLIDATION_SCAN_TASK)]
        runs = [s for _t, _a, s in jobs(fresh_db, CONSOLIDATE_TASK)]
        return "succeeded" in scans and len(runs) >= 3 and set(runs) == {"succeeded"}

    try:
        async with asyncio.timeout(60):
            while not done():
                assert not worker.done(), worker
                await asyncio.sleep(0.1)
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        await manager.close()
    # one consolidation a owner key and writer, each as that owner, everything since the start
    owners = sorted(
        (a["tenant_id"], a["project_id"], a["user_id"], a["principal_id"])
        for _t, a, _s in jobs(fresh_db, CONSOLIDATE_TASK)
    )
    assert owners == [
        ("acme", "", "dana", "dana"),
        ("acme", "", "erin", "erin"),
        ("other", "p1", "", "otto"),
    ]
    assert {a["since"] for _t, a, _s in jobs(fresh_db, CONSOLIDATE_TASK)} == {
        datetime(1970, 1, 1).isoformat() + "+00:00"
    }
    # Dana's two restatements are one current memory now; Otto's project memories too
    assert merged(rows_of(fresh_db, "dana"))
    assert rows_of(fresh_db, "erin") == [("Erin rides to work", True)]
    found = await manager.current_memories(OTTO, ["project"])
    assert [m.content for m in found] in (
        ["The deploy runs on Fridays"],
        ["the deploy runs on fridays!"],
    )
    # the erased user: nothing of theirs queued, read or written
    assert rows_of(fresh_db, "bob") == []


async def test_a_later_run_looks_only_at_what_was_written_since_the_last(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(
        database, embedder=HashingEmbedder(), config=MemoryManagerConfig(jobs_in_process=False)
    )
    runner = manager.job_runner()
    try:
        await manager.save_many(DANA, [Memory(content=text) for text in TEAS])
        await runner.open()
        # a run of the periodic task, as a worker would (succeeded, with its start)
        await runner.app.configure_task(CONSOLIDATION_SCAN_TASK).defer_async(timestamp=0)
        await runner.run_worker(wait=False, install_signal_handlers=False)
        first = jobs(fresh_db, CONSOLIDATE_TASK)
        assert [(a["user_id"], s) for _t, a, s in first] == [("dana", "succeeded")]
        # as if that run had started ten minutes ago, and Dana written twenty
        with psycopg.connect(fresh_db.superuser_url) as conn:
            conn.execute(
                "update harbor_jobs.procrastinate_events set at = at - interval '10 minutes'"
            )
            conn.execute("set session_replication_role = replica")  # (past the add-only guard)
            conn.execute(
                "update harbor.memories set created_at = created_at - interval '20 minutes'"
            )
        await manager.save(ERIN, Memory(content="Erin rides to work"))
        await runner.app.configure_task(CONSOLIDATION_SCAN_TASK).defer_async(timestamp=1)
        await runner.run_worker(wait=False, install_signal_handlers=False)
    finally:
        await manager.close()
    runs = jobs(fresh_db, CONSOLIDATE_TASK)
    # the second run found only Erin, who wrote since the first, and compared from then
    assert [(a["user_id"], s) for _t, a, s in runs] == [
        ("dana", "succeeded"),
        ("erin", "succeeded"),
    ]
    assert datetime.fromisoformat(runs[1][1]["since"]) > datetime.fromisoformat(runs[0][1]["since"])


async def test_a_consolidation_queued_for_a_user_erased_since_never_runs(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(
        database, embedder=HashingEmbedder(), config=MemoryManagerConfig(jobs_in_process=False)
    )
    runner = manager.job_runner()
    try:
        await manager.save_many(DANA, [Memory(content=text) for text in TEAS])
        await manager.save_many(
            BOB, [Memory(content="Bob likes tea."), Memory(content="bob likes TEA")]
        )
        await runner.open()
        assert await runner._queue_periodic_consolidations() == 2
        assert sorted(a["user_id"] for _t, a, _s in jobs(fresh_db, CONSOLIDATE_TASK)) == [
            "bob",
            "dana",
        ]
        await manager.erase("acme", user_id="bob")
        await runner.run_worker(wait=False, install_signal_handlers=False)
    finally:
        await manager.close()
    assert [(a["user_id"], s) for _t, a, s in jobs(fresh_db, CONSOLIDATE_TASK)] == [
        ("dana", "succeeded")
    ]
    assert rows_of(fresh_db, "bob") == []
    assert merged(rows_of(fresh_db, "dana"))


async def test_the_periodic_consolidation_is_off_unless_configured(database: Database) -> None:
    def periodic(manager: MemoryManager) -> list[str]:
        registry = manager.job_runner().app.periodic_registry.periodic_tasks
        return sorted(
            p.cron for (name, _id), p in registry.items() if name == CONSOLIDATION_SCAN_TASK
        )

    assert periodic(MemoryManager.from_database(database)) == []
    config = MemoryManagerConfig(consolidation_cron="*/15 * * * *")
    assert periodic(MemoryManager.from_database(database, config=config)) == ["*/15 * * * *"]


def test_only_the_administrator_lists_the_owners(fresh_db: PgDatabase) -> None:
    with psycopg.connect(fresh_db.app_url) as conn:
        try:
            conn.execute("select * from harbor.consolidation_owners(null)")
        except psycopg.errors.InsufficientPrivilege:
            pass
        else:
            raise AssertionError("the application role listed every tenant's owners")
    with psycopg.connect(fresh_db.admin_url) as conn:
        conn.execute("set role harbor_admin")
        assert conn.execute("select * from harbor.consolidation_owners(null)").fetchall() == []
