"""Re-embedding after a model change: a resumable backfill, and recall's switch once it is done."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import psycopg
import pytest

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryConfigurationError, MemoryScopeError
from harbor_pg.jobs import REEMBED_TASK
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from tests.conftest import PgDatabase, run_cli

DANA = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s1")
ERIN = MemoryOwner(tenant_id="acme", principal_id="erin", session_id="s1")
PROJECT = MemoryOwner(tenant_id="acme", project_id="p1", principal_id="dana", session_id="s1")
OLD = HashingEmbedder(384)  # hashing-v1-384
FACTS = [f"Dana keeps fact number {i} about the harbor garden" for i in range(10)]


class ScriptedEmbedder:
    """The hashing embedder under another model id, counting what it is asked; ``gate``
    holds each ``embed`` call until set, ``fail_after`` makes the call after that many fail
    (a worker killed mid-backfill)."""

    def __init__(self, model_id: str = "scripted-v2-256") -> None:
        self._inner = HashingEmbedder(256)
        self._model_id = model_id
        self.queries = 0
        self.embedded: list[str] = []
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.fail_after: int | None = None
        self.relevance_threshold = self._inner.relevance_threshold

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def dimensions(self) -> int:
        return 256

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_after is not None:
            if self.fail_after <= 0:
                raise RuntimeError("the worker was killed")
            self.fail_after -= 1
        self.embedded.extend(texts)
        return await self._inner.embed(texts)

    async def embed_query(self, text: str) -> list[float]:
        self.queries += 1
        return await self._inner.embed_query(text)


class CountingOld(HashingEmbedder):
    def __init__(self) -> None:
        super().__init__(384)
        self.queries = 0

    async def embed_query(self, text: str) -> list[float]:
        self.queries += 1
        return await super().embed_query(text)


def vectors(db: PgDatabase) -> list[tuple[str, int]]:
    """(model_id, rows) of every vector, and no (memory, model, kind) twice."""
    with psycopg.connect(db.superuser_url) as conn:
        rows = conn.execute(
            "select model_id, count(*) from harbor.memory_embeddings group by 1 order by 1"
        ).fetchall()
    return [(r[0], int(r[1])) for r in rows]


async def seed(database: Database) -> None:
    manager = MemoryManager.from_database(database, embedder=OLD)
    for fact in FACTS:
        await manager.inject_memory(DANA, fact)
    await manager.inject_memory(DANA, "Dana's session fact about the harbor", scope="session")
    await manager.inject_memory(
        DANA, "Dana asked about the garden shed", context="What about the shed?"
    )
    await manager.inject_memory(PROJECT, "The p1 project garden opens in May", scope="project")
    await manager.inject_memory(ERIN, "Erin tends the harbor garden roses")
    await manager.inject_memory(
        MemoryOwner(tenant_id="acme"), "acme's garden rules", scope="tenant"
    )
    await manager.inject_memory(
        MemoryOwner(tenant_id="other", principal_id="otto"), "otto's harbor garden"
    )


async def test_recall_answers_from_the_old_model_until_the_backfill_is_complete(
    database: Database, fresh_db: PgDatabase
) -> None:
    await seed(database)
    # 16 memories, one with a context: 17 vectors of the old model
    assert vectors(fresh_db) == [("hashing-v1-384", 17)]
    old, new = CountingOld(), ScriptedEmbedder()
    manager = MemoryManager.from_database(database, embedder=new, previous_embedder=old)
    manager.reembed_recheck_seconds = 0.0
    before = [m.content for m in await manager.recall(DANA, "harbor garden fact")]
    assert before and old.queries == 1 and new.queries == 0

    new.gate = asyncio.Event()
    new.gate.set()
    done: list[tuple[int, int]] = []

    def progress(memories: int, missing: int) -> None:
        if memories >= 8 and not any(d >= 8 for d, _m in done):
            new.gate.clear()  # type: ignore[union-attr]  # two batches in: hold the next
        done.append((memories, missing))

    backfill = asyncio.get_running_loop().create_task(
        manager.reembed("acme", batch_size=4, progress=progress)
    )
    async with asyncio.timeout(10):
        while not (done and done[-1][0] >= 8):
            assert not backfill.done(), backfill
            await asyncio.sleep(0.01)
    assert 8 <= dict(vectors(fresh_db))["scripted-v2-256"] < 16
    during = [m.content for m in await manager.recall(DANA, "harbor garden fact")]
    assert during == before and old.queries == 2 and new.queries == 0
    new.gate.set()
    report = await asyncio.wait_for(backfill, timeout=30)

    # acme's 15 memories (otto's tenant untouched), 16 vectors with the context one
    assert report.missing == 15 and report.memories == 15 and report.vectors == 16
    assert done[0] == (0, 15) and done[-1] == (15, 15)
    assert vectors(fresh_db) == [("hashing-v1-384", 17), ("scripted-v2-256", 16)]
    after = [m.content for m in await manager.recall(DANA, "harbor garden fact")]
    assert new.queries == 1 and old.queries == 2
    # Dana's memories, found with the new model's query vector among its vectors
    assert after and all("garden" in text or "harbor" in text for text in after)
    assert "otto's harbor garden" not in after and "Erin tends the harbor garden roses" not in after
    # once switched, never checked again
    await manager.recall(DANA, "garden")
    assert new.queries == 2 and old.queries == 2
    # a second backfill finds nothing missing
    assert await manager.reembed("acme") == (0, 0, 0)


async def test_a_backfill_stopped_midway_continues_and_writes_nothing_twice(
    database: Database, fresh_db: PgDatabase
) -> None:
    await seed(database)
    new = ScriptedEmbedder()
    # the tenant's and the project's keys (a memory each), two batches of Dana's, then
    # the "worker" dies
    new.fail_after = 4
    manager = MemoryManager.from_database(database, embedder=new, previous_embedder=OLD)
    with pytest.raises(RuntimeError):
        await manager.reembed("acme", batch_size=4)
    first = list(new.embedded)
    with psycopg.connect(fresh_db.superuser_url) as conn:
        row = conn.execute(
            "select count(*) from harbor.memory_embeddings"
            " where model_id = 'scripted-v2-256' and not with_context"
        ).fetchone()
    assert row is not None
    written = int(row[0])
    assert written == 10
    assert dict(vectors(fresh_db))["scripted-v2-256"] == len(first)
    # still incomplete: recall stays on the old model
    assert await manager.query_embedder(DANA) is OLD

    new.fail_after = None
    report = await manager.reembed("acme", batch_size=4)
    assert report.missing == report.memories == 15 - written
    # every text embedded once over both runs, and one vector per memory and kind
    assert len(new.embedded) == len(set(new.embedded)) == 16
    assert vectors(fresh_db) == [("hashing-v1-384", 17), ("scripted-v2-256", 16)]
    # an owner found incomplete is checked again after reembed_recheck_seconds (5)
    assert await manager.query_embedder(DANA) is OLD
    manager.reembed_recheck_seconds = 0.0
    assert await manager.query_embedder(DANA) is new


async def test_a_queued_backfill_runs_on_a_worker_and_switches_recall(
    database: Database, fresh_db: PgDatabase
) -> None:
    await seed(database)
    new = ScriptedEmbedder()
    config = MemoryManagerConfig(jobs_in_process=False)
    manager = MemoryManager.from_database(
        database, embedder=new, previous_embedder=OLD, config=config
    )
    manager.reembed_recheck_seconds = 0.0
    job = await manager.queue_reembed("acme")
    assert job is not None
    assert await manager.queue_reembed("acme") is None  # one pending a tenant
    assert await manager.query_embedder(ERIN) is OLD
    try:
        await asyncio.wait_for(manager.run_worker(wait=False), timeout=30)
    finally:
        await manager.close()
    with psycopg.connect(fresh_db.admin_url) as conn:
        rows = conn.execute(
            "select status::text from harbor_jobs.procrastinate_jobs where task_name = %s",
            (REEMBED_TASK,),
        ).fetchall()
    assert rows == [("succeeded",)]
    assert vectors(fresh_db) == [("hashing-v1-384", 17), ("scripted-v2-256", 16)]
    assert await manager.query_embedder(ERIN) is new


async def test_a_worker_with_another_model_refuses_the_backfill(database: Database) -> None:
    manager = MemoryManager.from_database(database, embedder=ScriptedEmbedder("other-v3"))
    with pytest.raises(MemoryConfigurationError):
        await manager.run_reembed_job("acme", "scripted-v2-256")
    with pytest.raises(MemoryScopeError):
        await manager.bound_to(DANA).reembed("acme")
    with pytest.raises(MemoryConfigurationError):
        await MemoryManager.from_database(database).reembed("acme")  # no embedder


def test_the_command_backfills_a_tenant_and_queues_it(fresh_db: PgDatabase) -> None:
    async def seed_other_model() -> None:
        db = Database(fresh_db.app_url, fresh_db.admin_url)
        await db.open()
        try:
            manager = MemoryManager.from_database(db, embedder=ScriptedEmbedder("retired-v0"))
            for fact in FACTS[:3]:
                await manager.inject_memory(DANA, fact)
        finally:
            await db.close()

    asyncio.run(seed_other_model())
    done = run_cli("reembed", "--tenant", "acme", url=fresh_db.superuser_url)
    assert done.returncode == 0, done.stderr
    assert "3 memories given 3 vectors of " in done.stderr
    [(_model, rows)] = [v for v in vectors(fresh_db) if v[0] != "retired-v0"]
    assert rows == 3
    again = run_cli("reembed", "--tenant", "acme", url=fresh_db.superuser_url)
    assert "0 memories given 0 vectors" in again.stderr
    queued = run_cli("reembed", "--tenant", "acme", "--queue", url=fresh_db.superuser_url)
    assert queued.returncode == 0, queued.stderr
    assert queued.stdout.startswith("job ") and "queued" in queued.stdout
    jobs = run_cli("jobs", url=fresh_db.superuser_url)
    assert REEMBED_TASK in jobs.stdout, jobs.stdout
