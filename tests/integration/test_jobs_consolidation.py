"""A consolidation job after each extraction: queued by the extraction's worker, one
pending per owner, comparing the memories stored since the extraction began."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.jobs import CONSOLIDATE_TASK, EXTRACT_SESSION_TASK
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory
from tests.conftest import PgDatabase
from tests.integration.test_jobs_append import TeaModel, jobs

DANA = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s1")
ERIN = MemoryOwner(tenant_id="acme", principal_id="erin", session_id="s1")
TEAS = ("Dana likes oolong tea.", "dana likes OOLONG tea!")


async def test_an_extraction_queues_a_consolidation_of_its_owner(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(
        database,
        extraction_model=TeaModel(),
        embedder=HashingEmbedder(),
        config=MemoryManagerConfig(consolidate_after_extraction=True),
    )
    try:
        for text in TEAS:
            await manager.save(DANA, Memory(content=text))
        before = datetime.now(UTC)
        await manager.append(DANA, ConversationMessage(role="user", content="I love green tea"))
        await asyncio.wait_for(manager.drain(), timeout=60)
    finally:
        await manager.close()
    assert [s for _t, _a, s in jobs(fresh_db, EXTRACT_SESSION_TASK)] == ["succeeded"]
    [(_task, args, status)] = jobs(fresh_db, CONSOLIDATE_TASK)
    assert status == "succeeded"
    # the owner's ids and since: the extraction's start, less the clock margin
    assert {k: args[k] for k in ("tenant_id", "principal_id", "user_id")} == {
        "tenant_id": "acme",
        "principal_id": "dana",
        "user_id": "dana",
    }
    since = datetime.fromisoformat(args["since"])
    assert before - timedelta(minutes=2) < since < before
    # the two restatements are one current memory now, the extracted fact beside it
    found = [m.content for m in await manager.search(DANA, "likes oolong tea")]
    oolong = [text for text in found if "oolong" in text.lower()]
    assert len(oolong) == 1 and oolong[0] in TEAS
    assert "The user drinks green tea every morning" in found


async def test_one_consolidation_pending_per_owner(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(
        database,
        extraction_model=TeaModel(),
        config=MemoryManagerConfig(jobs_in_process=False, consolidate_after_extraction=True),
    )
    runner = manager.job_runner()
    await runner.open()
    try:
        start = datetime.now(UTC)
        for owner in (DANA, DANA, ERIN, DANA.model_copy(update={"session_id": "s2"})):
            ids = {
                "tenant_id": owner.tenant_id,
                "principal_id": owner.principal_id,
                "user_id": owner.user_id,
                "session_id": owner.session_id,
            }
            await runner._queue_consolidation(ids, start)
    finally:
        await runner.close()
    pending = [(a["user_id"], s) for _t, a, s in jobs(fresh_db, CONSOLIDATE_TASK)]
    # Dana's later ones (another session too) found hers pending; Erin has her own
    assert pending == [("dana", "todo"), ("erin", "todo")]


async def test_no_consolidation_is_queued_by_default(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(database, extraction_model=TeaModel())
    try:
        await manager.append(DANA, ConversationMessage(role="user", content="I love green tea"))
        await asyncio.wait_for(manager.drain(), timeout=60)
    finally:
        await manager.close()
    assert [s for _t, _a, s in jobs(fresh_db, EXTRACT_SESSION_TASK)] == ["succeeded"]
    assert jobs(fresh_db, CONSOLIDATE_TASK) == []


class ObservingTeaModel(TeaModel):
    """TeaModel that also writes observations."""

    async def generate_text(self, system: str, user: str) -> str:
        return f"Dana's tea habits, from {user.count('- ')} facts"


async def test_the_consolidation_job_writes_observations_when_asked(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(
        database,
        extraction_model=ObservingTeaModel(),
        embedder=HashingEmbedder(),
        config=MemoryManagerConfig(
            consolidate_after_extraction=True, observe_after_consolidation=True
        ),
    )
    try:
        for text in ("Dana brews at seven", "Dana likes it strong", "Dana buys loose leaves"):
            await manager.save(DANA, Memory(content=text, entity_ids=["drink:tea"]))
        await manager.append(DANA, ConversationMessage(role="user", content="I love green tea"))
        await asyncio.wait_for(manager.drain(), timeout=60)
    finally:
        await manager.close()
    assert [s for _t, _a, s in jobs(fresh_db, CONSOLIDATE_TASK)] == ["succeeded"]
    found = await manager.recall(DANA, "Dana tea habits", wanted_types=["observation"], top_k=3)
    assert found and found[0].content == "Dana's tea habits, from 3 facts"
    assert found[0].entity_ids == ["drink:tea"]
