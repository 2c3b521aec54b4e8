"""Retention runs as a periodic job on the queue, with the worker's configured rules."""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
import pytest
from pydantic import ValidationError

from harbor_pg.config import RetentionRule
from harbor_pg.db.connection import Database
from harbor_pg.errors import MemoryScopeError
from harbor_pg.jobs import RETENTION_TASK
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from tests.conftest import PgDatabase

DANA = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s1")
OTTO = MemoryOwner(tenant_id="other", principal_id="otto", session_id="s1")


def memory_texts(db: PgDatabase) -> list[tuple[str, str]]:
    with psycopg.connect(db.superuser_url) as conn:
        rows = conn.execute(
            "select tenant_id, content from harbor.memories order by tenant_id, content"
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def retention_jobs(db: PgDatabase) -> list[str]:
    with psycopg.connect(db.admin_url) as conn:
        rows = conn.execute(
            "select status::text from harbor_jobs.procrastinate_jobs where task_name = %s",
            (RETENTION_TASK,),
        ).fetchall()
    return [r[0] for r in rows]


async def test_a_worker_applies_its_configured_retention_on_its_own(
    database: Database, fresh_db: PgDatabase
) -> None:
    config = MemoryManagerConfig(
        jobs_in_process=False,
        retention={"acme": (RetentionRule(max_age_seconds=0, min_sensitivity="pii"),)},
        # every minute: a worker starting defers the minute just begun at once
        retention_cron="* * * * *",
    )
    manager = MemoryManager.from_database(database, config=config)
    await manager.inject_memory(DANA, "dana's pii fact", sensitivity="pii")
    await manager.inject_memory(DANA, "dana's plain fact")
    await manager.inject_memory(OTTO, "otto's pii fact", sensitivity="pii")
    assert retention_jobs(fresh_db) == []
    worker = asyncio.get_running_loop().create_task(
        manager.job_runner().run_worker(install_signal_handlers=False)
    )
    try:
        async with asyncio.timeout(30):
            while retention_jobs(fresh_db) != ["succeeded"]:
                assert not worker.done(), worker
                await asyncio.sleep(0.1)
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        await manager.close()
    # acme's rule deleted its pii memory; the tenant no rule names was left alone
    assert memory_texts(fresh_db) == [
        ("acme", "dana's plain fact"),
        ("other", "otto's pii fact"),
    ]


async def test_the_retention_job_is_periodic_only_where_retention_is_configured(
    database: Database,
) -> None:
    def periodic(manager: MemoryManager) -> list[str]:
        registry = manager.job_runner().app.periodic_registry.periodic_tasks
        return sorted(p.cron for (name, _id), p in registry.items() if name == RETENTION_TASK)

    plain = MemoryManager.from_database(database)
    assert periodic(plain) == []
    config = MemoryManagerConfig(retention={"acme": ()})
    assert periodic(MemoryManager.from_database(database, config=config)) == ["23 * * * *"]


async def test_configured_retention_runs_each_rule_of_each_named_tenant(
    database: Database, fresh_db: PgDatabase
) -> None:
    config = MemoryManagerConfig(
        retention={
            "acme": (
                RetentionRule(max_age_seconds=0, min_sensitivity="pii"),
                RetentionRule(max_age_seconds=0, scope="session"),
            ),
            "other": (),
        }
    )
    manager = MemoryManager.from_database(database, config=config)
    await manager.inject_memory(DANA, "dana's pii fact", sensitivity="pii")
    await manager.inject_memory(DANA, "dana's session fact", scope="session")
    await manager.inject_memory(DANA, "dana's plain fact")
    await manager.inject_memory(OTTO, "otto's pii fact", sensitivity="pii")
    receipts = await manager.apply_configured_retention()
    assert [r.long_term for r in receipts["acme"]] == [1, 1]
    assert [r.long_term for r in receipts["other"]] == [0]
    assert memory_texts(fresh_db) == [("acme", "dana's plain fact"), ("other", "otto's pii fact")]
    with pytest.raises(MemoryScopeError):
        await manager.bound_to(DANA).apply_configured_retention()


def test_a_retention_rule_is_checked_when_configured() -> None:
    with pytest.raises(ValidationError):
        RetentionRule(scope="user")  # an age is needed
    with pytest.raises(ValidationError):
        RetentionRule(max_age_seconds=-1)
    with pytest.raises(ValidationError):
        RetentionRule(max_age_seconds=float("inf"))
