"""Appends queue their fact extraction in the turn's transaction; a worker runs it as the owner."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryConfigurationError, MemoryScopeError
from harbor_pg.jobs import EXTRACT_SESSION_TASK, FOLD_TASK, PURGE_TASK
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.short_term import PostgresShortTermStore, _append_params
from harbor_pg.validation import MIN_TTL_SECONDS
from tests.conftest import PgDatabase, run_cli

DANA = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s1")
ERIN = MemoryOwner(tenant_id="acme", principal_id="erin", session_id="s1")


class TeaModel:
    """A scripted model: one fact per call, naming whose session it read."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate_text(self, system: str, user: str) -> str:
        raise NotImplementedError

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        self.calls += 1
        drink = "green tea" if "green tea" in user else "black coffee"
        fact = {
            "content": f"The user drinks {drink} every morning",
            "type": "preference",
            "scope": "user",
            "importance": 0.7,
            "entities": [],
            "sensitivity": "none",
        }
        return schema.model_validate({"facts": [fact]})


def jobs(db: PgDatabase, task: str = EXTRACT_SESSION_TASK) -> list[tuple[str, dict[str, Any], str]]:
    """The queue's jobs of ``task`` (workers queue the periodic upkeep too)."""
    with psycopg.connect(db.admin_url) as conn:
        rows = conn.execute(
            "select task_name, args, status::text from harbor_jobs.procrastinate_jobs"
            " where task_name = %s order by id",
            (task,),
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


async def test_a_committed_turn_has_its_job_and_the_job_holds_ids_only(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(
        database,
        extraction_model=TeaModel(),
        config=MemoryManagerConfig(jobs_in_process=False),
    )
    turn = await manager.append(DANA, ConversationMessage(role="user", content="I drink tea"))
    [(task, args, status)] = jobs(fresh_db)
    assert (task, status) == (EXTRACT_SESSION_TASK, "todo")
    assert args == {
        "tenant_id": "acme",
        "project_id": "",
        "principal_id": "dana",
        "user_id": "dana",
        "session_id": "s1",
        "run_id": "",
        "from_id": turn.id,
    }
    # without an extraction model, an append queues nothing
    plain = MemoryManager.from_database(database)
    await plain.append(DANA, ConversationMessage(role="user", content="and coffee"))
    assert len(jobs(fresh_db)) == 1


async def test_a_rolled_back_turn_leaves_no_job(database: Database, fresh_db: PgDatabase) -> None:
    params = {
        **_append_params(DANA, ConversationMessage(role="user", content="never stored")),
        "min_turns": 8,
        "cooldown_seconds": 0,
        "extract": True,
        "fold": True,
        "slots": 0,
        "delay_seconds": 0.0,
    }
    with pytest.raises(RuntimeError):
        async with database.transaction(DANA) as conn:
            cur = await conn.execute(query("append_message_with_jobs"), params)
            row = await cur.fetchone()
            assert row is not None and len(row["job_ids"]) == 1
            raise RuntimeError("the caller's transaction fails after the append")
    assert jobs(fresh_db) == []
    assert await PostgresShortTermStore(database).recent(DANA, 10) == []


async def test_the_manager_runs_the_jobs_itself_as_each_owner(
    database: Database, fresh_db: PgDatabase
) -> None:
    model = TeaModel()
    manager = MemoryManager.from_database(
        database, extraction_model=model, embedder=HashingEmbedder()
    )
    try:
        await manager.append(DANA, ConversationMessage(role="user", content="I love green tea"))
        await manager.append(ERIN, ConversationMessage(role="user", content="Coffee for me"))
        await asyncio.wait_for(manager.drain(), timeout=30)
        assert model.calls == 2
        assert [s for _t, _a, s in jobs(fresh_db)] == ["succeeded", "succeeded"]
        dana = [m.content for m in await manager.search(DANA, "drinks")]
        erin = [m.content for m in await manager.search(ERIN, "drinks")]
        assert dana == ["The user drinks green tea every morning"]
        assert erin == ["The user drinks black coffee every morning"]
    finally:
        await manager.close()


async def test_a_worker_without_a_model_fails_the_job_visibly(
    database: Database, fresh_db: PgDatabase
) -> None:
    queueing = MemoryManager.from_database(
        database, extraction_model=TeaModel(), config=MemoryManagerConfig(jobs_in_process=False)
    )
    await queueing.append(DANA, ConversationMessage(role="user", content="I drink tea"))
    worker = MemoryManager.from_database(database)  # no extraction model here
    try:
        await asyncio.wait_for(worker.run_worker(wait=False), timeout=30)
    finally:
        await worker.close()
    assert [s for _t, _a, s in jobs(fresh_db)] == ["failed"]


def test_extraction_on_append_needs_the_postgres_stores() -> None:
    manager = MemoryManager(extraction_model=TeaModel())
    from harbor_pg.tiers.in_process import InMemoryShortTermStore

    manager.short_term = InMemoryShortTermStore()
    with pytest.raises(MemoryConfigurationError, match="PostgreSQL"):
        asyncio.run(manager.append(DANA, ConversationMessage(role="user", content="hi")))


async def test_harbor_pg_worker_runs_the_queue_with_the_applications_models(
    database: Database, fresh_db: PgDatabase
) -> None:
    queueing = MemoryManager.from_database(
        database, extraction_model=TeaModel(), config=MemoryManagerConfig(jobs_in_process=False)
    )
    await queueing.append(DANA, ConversationMessage(role="user", content="I love green tea"))
    await queueing.append(ERIN, ConversationMessage(role="user", content="Coffee, black"))
    done = run_cli(
        "worker",
        "--once",
        "--concurrency",
        "2",
        "--manager",
        "tests.integration.jobs_worker_app:manager",
        url=fresh_db.superuser_url,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [s for _t, _a, s in jobs(fresh_db)] == ["succeeded", "succeeded"]
    assert [m.content for m in await queueing.search(ERIN, "drinks")] == [
        "The user drinks black coffee every morning"
    ]


async def test_a_bound_manager_queues_and_the_jobs_still_run_as_their_owners(
    database: Database, fresh_db: PgDatabase
) -> None:
    model = TeaModel()
    manager = MemoryManager.from_database(database, extraction_model=model)
    dana = manager.bound_to(DANA)
    try:
        await dana.append(DANA, ConversationMessage(role="user", content="green tea please"))
        await manager.bound_to(ERIN).append(ERIN, ConversationMessage(role="user", content="tea"))
        await asyncio.wait_for(dana.drain(), timeout=30)
        assert [s for _t, _a, s in jobs(fresh_db)] == ["succeeded", "succeeded"]
        assert model.calls == 2
        # a bound manager runs no job of another owner
        with pytest.raises(MemoryScopeError):
            await dana.run_extraction_job(ERIN, 1)
        with pytest.raises(MemoryScopeError):
            dana.job_runner()
    finally:
        await manager.close()


async def test_upkeep_purges_expired_working_state_as_a_periodic_job(
    database: Database, fresh_db: PgDatabase
) -> None:
    run = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s1", run_id="r1")
    manager = MemoryManager.from_database(database)
    await manager.update(run, {"step": "retrieval"}, ttl_seconds=MIN_TTL_SECONDS)
    await asyncio.sleep(MIN_TTL_SECONDS + 0.2)
    runner = manager.job_runner()
    [(cron, _registered)] = [
        (p.cron, p)
        for (name, _id), p in runner.app.periodic_registry.periodic_tasks.items()
        if name == PURGE_TASK
    ]
    assert cron == "*/10 * * * *"
    try:
        await runner.open()
        await runner.app.configure_task(PURGE_TASK).defer_async(timestamp=0)
        await asyncio.wait_for(manager.run_worker(wait=False), timeout=30)
    finally:
        await manager.close()
    purges = [s for _t, _a, s in jobs(fresh_db, PURGE_TASK)]
    assert purges and set(purges) == {"succeeded"}
    with psycopg.connect(fresh_db.superuser_url) as conn:
        assert conn.execute("select count(*) from harbor.working_state").fetchone() == (0,)


async def test_the_turn_that_makes_a_session_due_queues_its_summary_fold(
    database: Database, fresh_db: PgDatabase
) -> None:
    from harbor_pg.policy import MemoryPolicy

    policy = MemoryPolicy(
        summarise_after_turns=4, summary_keep_messages=1, summary_cooldown_seconds=0
    )
    config = MemoryManagerConfig(summaries_on_queue=True, jobs_in_process=False)
    manager = MemoryManager.from_database(database, policy=policy, config=config)
    for i in range(3):
        await manager.append(DANA, ConversationMessage(role="user", content=f"budget item {i}"))
    assert jobs(fresh_db, FOLD_TASK) == []  # not due yet, and nothing runs in this process
    await manager.append(DANA, ConversationMessage(role="user", content="budget item 3"))
    [(_task, args, status)] = jobs(fresh_db, FOLD_TASK)
    assert status == "todo" and "message_id" not in args and args["session_id"] == "s1"
    assert manager.long_term is not None
    assert await manager.long_term.load_summary(DANA) is None  # type: ignore[attr-defined]
    try:
        await asyncio.wait_for(manager.run_worker(wait=False), timeout=30)
    finally:
        await manager.close()
    assert [s for _t, _a, s in jobs(fresh_db, FOLD_TASK)] == ["succeeded"]
    summary = await manager.long_term.load_summary(DANA)  # type: ignore[attr-defined]
    assert summary is not None and "budget" in summary.content


async def test_erasure_with_jobs_pending_leaves_none_to_run(
    database: Database, fresh_db: PgDatabase
) -> None:
    config = MemoryManagerConfig(jobs_in_process=False)
    model = TeaModel()
    manager = MemoryManager.from_database(database, extraction_model=model, config=config)
    for text in ("green tea", "more green tea"):
        await manager.append(DANA, ConversationMessage(role="user", content=text))
    await manager.append(ERIN, ConversationMessage(role="user", content="coffee"))
    await manager.erase("acme", user_id="dana")
    assert [a["user_id"] for _t, a, _s in jobs(fresh_db)] == ["erin"]
    await asyncio.wait_for(manager.run_worker(wait=False), timeout=30)
    assert model.calls == 1  # Erin's job; none of Dana's ran
    assert await manager.search(DANA, "drinks") == []


async def test_running_jobs_in_process_needs_the_elevated_login(fresh_db: PgDatabase) -> None:
    app_only = Database(fresh_db.app_url, min_size=1, max_size=2)
    with pytest.raises(MemoryConfigurationError, match="elevated login"):
        MemoryManager.from_database(app_only, extraction_model=TeaModel())
    # queueing for workers elsewhere needs only the application login
    await app_only.open()
    try:
        config = MemoryManagerConfig(jobs_in_process=False)
        manager = MemoryManager.from_database(app_only, extraction_model=TeaModel(), config=config)
        await manager.append(DANA, ConversationMessage(role="user", content="tea"))
        assert [s for _t, _a, s in jobs(fresh_db)] == ["todo"]
    finally:
        await app_only.close()


class PromptModel(TeaModel):
    """TeaModel that keeps each extraction's prompt."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: list[str] = []

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        self.prompts.append(user)
        return await super().generate_structured(system, user, schema)


def extraction_flag(db: PgDatabase, owner: MemoryOwner) -> Any:
    with psycopg.connect(db.superuser_url) as conn:
        row = conn.execute(
            "select extraction_queued from harbor.owner_locks"
            " where tenant_id = %s and user_id = %s and session_id = %s and scope = 'session'",
            (owner.tenant_id, owner.principal_id, owner.session_id),
        ).fetchone()
    return None if row is None else row[0]


async def test_turns_appended_while_the_sessions_extraction_waits_share_it(
    database: Database, fresh_db: PgDatabase
) -> None:
    config = MemoryManagerConfig(jobs_in_process=False)
    queueing = MemoryManager.from_database(database, extraction_model=TeaModel(), config=config)
    first = await queueing.append(DANA, ConversationMessage(role="user", content="turn one"))
    for text in ("turn two", "turn three"):
        await queueing.append(DANA, ConversationMessage(role="user", content=text))
    await queueing.append(ERIN, ConversationMessage(role="user", content="erin's turn"))
    queued = jobs(fresh_db)
    assert len(queued) == 2  # one waiting a session, however many turns
    assert [(a["user_id"], a["from_id"], s) for _t, a, s in queued[:1]] == [
        ("dana", first.id, "todo")
    ]
    assert extraction_flag(fresh_db, DANA) is True
    model = PromptModel()
    worker = MemoryManager.from_database(database, extraction_model=model, config=config)
    try:
        await asyncio.wait_for(worker.run_worker(wait=False), timeout=30)
        [dana] = [p for p in model.prompts if "turn one" in p]
        assert "turn two" in dana and "turn three" in dana  # one model call for the three
        assert model.calls == 2
        assert extraction_flag(fresh_db, DANA) is False
        # the job started: the next turn queues the next job, from that turn on
        fourth = await queueing.append(DANA, ConversationMessage(role="user", content="turn four"))
        assert [a["from_id"] for _t, a, s in jobs(fresh_db) if s == "todo"] == [fourth.id]
        await asyncio.wait_for(worker.run_worker(wait=False), timeout=30)
        # its window shows the turns before as well (the policy's recent_max_messages)
        assert "turn four" in model.prompts[-1] and "turn one" in model.prompts[-1]
        assert [s for _t, _a, s in jobs(fresh_db)] == ["succeeded"] * 3
    finally:
        await worker.close()


async def test_a_starting_extraction_waits_for_the_append_in_flight_and_reads_its_turn(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(
        database, extraction_model=TeaModel(), config=MemoryManagerConfig(jobs_in_process=False)
    )
    first = await manager.append(DANA, ConversationMessage(role="user", content="turn one"))
    params = {
        **_append_params(DANA, ConversationMessage(role="user", content="in flight")),
        "min_turns": 8,
        "cooldown_seconds": 0,
        "extract": True,
        "fold": False,
        "slots": 0,
        "delay_seconds": 0.0,
    }
    append = psycopg.connect(fresh_db.app_url)
    try:
        append.execute(
            "select harbor.set_identity('acme', principal_id => 'dana', session_id => 's1',"
            " is_local => true)"
        )
        row = append.execute(query("append_message_with_jobs"), params).fetchone()
        assert row is not None and row[3] is None  # the session's extraction waits already
        store = PostgresShortTermStore(database)
        assert first.id is not None
        claim = asyncio.create_task(store.claim_extraction(DANA, first.id, context=0, limit=50))
        await asyncio.sleep(1.0)
        assert not claim.done(), "the extraction must wait for the append in flight"
        append.commit()
    finally:
        append.close()
    turns = await asyncio.wait_for(claim, timeout=30)
    assert [t.content for t in turns] == ["turn one", "in flight"]
    # claimed: the next turn is the next job's
    later = await manager.append(DANA, ConversationMessage(role="user", content="later"))
    assert [a["from_id"] for _t, a, _s in jobs(fresh_db)] == [first.id, later.id]


async def test_an_extraction_delay_lets_a_conversations_turns_share_its_job(
    database: Database, fresh_db: PgDatabase
) -> None:
    config = MemoryManagerConfig(jobs_in_process=False, extraction_delay_seconds=60)
    manager = MemoryManager.from_database(database, extraction_model=TeaModel(), config=config)
    try:
        await manager.append(DANA, ConversationMessage(role="user", content="green tea"))
        with psycopg.connect(fresh_db.admin_url) as conn:
            [(delay,)] = conn.execute(
                "select extract(epoch from scheduled_at - now())"
                " from harbor_jobs.procrastinate_jobs where task_name = %s",
                (EXTRACT_SESSION_TASK,),
            ).fetchall()
        assert 55 < delay <= 60
        await asyncio.wait_for(manager.run_worker(wait=False), timeout=30)
        assert [s for _t, _a, s in jobs(fresh_db)] == ["todo"]  # not before its time
    finally:
        await manager.close()


async def test_a_cancelled_session_extraction_lets_the_next_turn_queue_one(
    database: Database, fresh_db: PgDatabase
) -> None:
    config = MemoryManagerConfig(jobs_in_process=False)
    manager = MemoryManager.from_database(database, extraction_model=TeaModel(), config=config)
    try:
        await manager.append(DANA, ConversationMessage(role="user", content="green tea"))
        with psycopg.connect(fresh_db.admin_url) as conn:
            [(job_id,)] = conn.execute("select id from harbor_jobs.procrastinate_jobs").fetchall()
        assert await manager.job_runner().cancel(job_id)
        assert extraction_flag(fresh_db, DANA) is False
        await manager.append(DANA, ConversationMessage(role="user", content="more tea"))
        assert [s for _t, _a, s in jobs(fresh_db)] == ["cancelled", "todo"]
    finally:
        await manager.close()
