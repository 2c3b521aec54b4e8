"""A queued job running when its subject is erased writes nothing after the erasure.

The erasure (harbor.erase) takes the lock of each of the subject's sessions before it
deletes anything; a job's write takes its session's lock and then looks for its turn,
in the same transaction. So a job waiting in its model while the user is erased finds
the turn gone and writes nothing, and a job that was writing when the erasure began
makes it wait, and what it wrote is erased with the rest.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryNotFoundError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import ConversationMessage, Memory, content_hash
from harbor_pg.tiers.long_term import PostgresLongTermStore
from tests.conftest import PgDatabase
from tests.integration.test_erasure_scan import columns_holding

TAG = "qz7erasedjob"  # in all of Dana's text
ERIN_TAG = "qz7keptjob"  # in all of Erin's
DANA = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s1")
ERIN = MemoryOwner(tenant_id="acme", principal_id="erin", session_id="s1")
DANA_SESSION = {"tenant_id": "acme", "user_id": "dana", "session_id": "s1"}


class GatedModel:
    """A scripted slow model: each call says it has begun, then waits until the test
    opens the gate, and answers one fact quoting the conversation's tag."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.answered = 0

    async def generate_text(self, system: str, user: str) -> str:
        raise NotImplementedError

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        self.entered.set()
        await self.gate.wait()
        self.answered += 1
        tag = TAG if TAG in user else ERIN_TAG
        fact = {
            "content": f"The user keeps the {tag} notebook",
            "type": "fact",
            "scope": "user",
            "importance": 0.8,
            "entities": [],
            "sensitivity": "none",
        }
        return schema.model_validate({"facts": [fact]})


async def _until(check: Any, seconds: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.05)


async def test_a_job_waiting_in_its_model_writes_nothing_once_its_user_is_erased(
    database: Database, fresh_db: PgDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="harbor_pg")
    model = GatedModel()
    manager = MemoryManager.from_database(
        database, extraction_model=model, embedder=HashingEmbedder()
    )
    try:
        # the same model and path write Erin's fact when nobody erases her
        model.gate.set()
        await manager.append(
            ERIN, ConversationMessage(role="user", content=f"Erin here, about {ERIN_TAG}")
        )
        await asyncio.wait_for(manager.drain(), timeout=30)
        assert [m.content for m in await manager.search(ERIN, ERIN_TAG)] == [
            f"The user keeps the {ERIN_TAG} notebook"
        ]

        model.gate.clear()
        model.entered.clear()
        await manager.append(
            DANA, ConversationMessage(role="user", content=f"Dana here, about {TAG}")
        )
        await asyncio.wait_for(model.entered.wait(), timeout=30)  # the job is in the model
        receipt = await manager.erase("acme", user_id="dana")
        assert receipt.short_term == 1
        model.gate.set()  # the model answers after the erasure committed
        # the job ends: it finds the turn gone (or, were it not fenced, writes the fact)
        await _until(lambda: "the turn is gone" in caplog.text or _holds(fresh_db, TAG))
        assert model.answered == 2
        # the erasure deleted the running job's row: its end is told, not an error
        await _until(lambda: "was erased while it ran" in caplog.text)
        assert "ConnectorException" not in caplog.text
    finally:
        model.gate.set()  # a failed step above must not leave the job in the model
        await manager.close()
    # nothing of Dana anywhere: no column of any table holds her text, and no turn,
    # memory, lock or job names her
    assert columns_holding(fresh_db, TAG) == set()
    with psycopg.connect(fresh_db.superuser_url) as conn:
        for statement in (
            "select count(*) from harbor.memories where user_id = 'dana' or principal_id = 'dana'",
            "select count(*) from harbor.messages where user_id = 'dana'",
            "select count(*) from harbor.owner_locks where user_id = 'dana'",
            "select count(*) from harbor_jobs.procrastinate_jobs where args ->> 'user_id' = 'dana'",
        ):
            assert conn.execute(statement).fetchone() == (0,), statement
    # what Erin's job wrote stays
    assert columns_holding(fresh_db, ERIN_TAG) >= {("harbor", "memories", "content")}


def _holds(db: PgDatabase, tag: str) -> bool:
    """Whether some memory's content holds ``tag``."""
    with psycopg.connect(db.superuser_url) as conn:
        row = conn.execute(
            "select exists (select 1 from harbor.memories where content like %s)", (f"%{tag}%",)
        ).fetchone()
    return bool(row and row[0])


async def test_an_erasure_waits_for_a_job_writing_and_erases_what_it_wrote(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    turn = await manager.append(DANA, ConversationMessage(role="user", content="Dana here"))
    # a job's write transaction, as the worker sends it: the session's lock, the turn
    # found, then (below, while the erasure waits) the fact
    job = psycopg.connect(fresh_db.app_url)
    job.execute(
        "select harbor.set_identity('acme', principal_id => 'dana', session_id => 's1',"
        " is_local => true)"
    )
    job.execute(
        query("job_write_lock"), {"tenant_id": "acme", "user_id": "dana", "session_id": "s1"}
    )
    job.execute(query("job_turn_present"), {"turn_id": turn.id})
    erased: list[Any] = []
    eraser = threading.Thread(
        target=lambda: erased.append(asyncio.run(_erase(fresh_db))), daemon=True
    )
    eraser.start()
    eraser.join(timeout=1.0)
    assert eraser.is_alive(), "the erasure must wait for the job's write"
    job.execute(
        "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
        " content_hash, source_session_id, source_message_ids)"
        " values ('acme', 'user', 'dana', 'dana', %s, md5(%s) || md5(%s), 's1', %s)",
        (f"The user keeps the {TAG} notebook", TAG, TAG, [str(turn.id)]),
    )
    job.commit()
    job.close()
    eraser.join(timeout=30)
    assert not eraser.is_alive() and erased and erased[0].long_term == 1
    assert columns_holding(fresh_db, TAG) == set()
    # and a job's write after the erasure finds the turn gone, in its own transaction
    with psycopg.connect(fresh_db.app_url) as late:
        late.execute(
            "select harbor.set_identity('acme', principal_id => 'dana', session_id => 's1',"
            " is_local => true)"
        )
        late.execute(query("job_write_lock"), DANA_SESSION)
        with pytest.raises(psycopg.errors.NoDataFound):
            late.execute(query("job_turn_present"), {"turn_id": turn.id})


async def _erase(db: PgDatabase) -> Any:
    database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
    await database.open()
    try:
        return await MemoryManager.from_database(database).erase("acme", user_id="dana")
    finally:
        await database.close()


async def test_a_fenced_write_after_the_erasure_raises_not_found(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    turn = await manager.append(DANA, ConversationMessage(role="user", content="Dana here"))
    await manager.erase("acme", user_id="dana")
    store = manager.long_term
    assert isinstance(store, PostgresLongTermStore)
    content = f"The user keeps the {TAG} notebook"
    fact = Memory(
        scope=MemoryScope.USER, content=content, content_hash=content_hash("user", content)
    )
    with pytest.raises(MemoryNotFoundError):
        await store.add_fact(DANA, fact, for_turn=int(turn.id or 0))
    assert columns_holding(fresh_db, TAG) == set()


class GatedSummaryModel:
    """A scripted slow summary model: says it has begun, waits for the gate, then
    summarises quoting the conversation's tag."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.answered = 0

    async def generate_text(self, system: str, user: str) -> str:
        self.entered.set()
        await self.gate.wait()
        self.answered += 1
        return f"Dana talked about the {TAG} notebook."

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        raise NotImplementedError


async def test_a_fold_waiting_in_its_model_saves_no_summary_once_its_session_is_erased(
    database: Database, fresh_db: PgDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    from harbor_pg.config import MemoryManagerConfig
    from harbor_pg.policy import MemoryPolicy

    caplog.set_level(logging.INFO, logger="harbor_pg")
    model = GatedSummaryModel()
    manager = MemoryManager.from_database(
        database,
        policy=MemoryPolicy(
            summarise_after_turns=4, summary_keep_messages=1, summary_cooldown_seconds=0
        ),
        config=MemoryManagerConfig(summaries_on_queue=True, job_retries=0),
        summary_model=model,
    )
    try:
        for i in range(4):
            await manager.append(DANA, ConversationMessage(role="user", content=f"{TAG} item {i}"))
        await asyncio.wait_for(model.entered.wait(), timeout=30)  # the fold is in the model
        await manager.erase("acme", user_id="dana", session_id="s1")
        model.gate.set()  # it answers after the erasure committed
        await _until(lambda: "was erased while it ran" in caplog.text or _holds(fresh_db, TAG))
        assert model.answered == 1
    finally:
        model.gate.set()
        await manager.close()
    assert columns_holding(fresh_db, TAG) == set()  # no summary, no turn, nothing


@pytest.mark.parametrize("session", ["new", "cleared"])
async def test_a_turn_appended_in_a_session_with_no_turn_during_the_erasure_is_erased(
    database: Database, fresh_db: PgDatabase, session: str
) -> None:
    from harbor_pg.tiers.short_term import _append_params

    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    await manager.append(DANA, ConversationMessage(role="user", content="Dana here"))
    s9 = DANA.model_copy(update={"session_id": "s9"})
    if session == "cleared":  # s9 had turns, none left: its lock row stays
        await manager.append(s9, ConversationMessage(role="user", content="an old turn"))
        assert await manager.clear(s9) == 1
    # an append of Dana's in a session no turn of which the erasure can see, its
    # extraction queued with it, its transaction still open when the erasure begins
    params = {
        **_append_params(s9, ConversationMessage(role="user", content=f"Dana: {TAG}")),
        "min_turns": 8,
        "cooldown_seconds": 0,
        "extract": True,
        "fold": False,
        "slots": 0,
        "delay_seconds": 0.0,
    }
    append = psycopg.connect(fresh_db.app_url)
    append.execute(
        "select harbor.set_identity('acme', principal_id => 'dana', session_id => 's9',"
        " is_local => true)"
    )
    row = append.execute(query("append_message_with_jobs"), params).fetchone()
    assert row is not None
    erased: list[Any] = []
    eraser = threading.Thread(
        target=lambda: erased.append(asyncio.run(_erase(fresh_db))), daemon=True
    )
    eraser.start()
    eraser.join(timeout=1.0)
    assert eraser.is_alive(), "the erasure must wait for the append in flight"
    append.commit()
    append.close()
    eraser.join(timeout=30)
    assert not eraser.is_alive() and erased and erased[0].short_term == 2
    assert columns_holding(fresh_db, TAG) == set()
    with psycopg.connect(fresh_db.superuser_url) as conn:
        for statement in (
            "select count(*) from harbor.messages where user_id = 'dana'",
            "select count(*) from harbor.owner_locks where user_id = 'dana'",
            "select count(*) from harbor_jobs.procrastinate_jobs where args ->> 'user_id' = 'dana'",
        ):
            assert conn.execute(statement).fetchone() == (0,), statement
    # an append after the erasure is a turn after it: stored, in a lock of its own
    await manager.append(DANA, ConversationMessage(role="user", content="Dana again"))
    assert [t.content for t in await manager.recent(DANA)] == ["Dana again"]


class GatedObserver:
    """A scripted slow model for observations: says it has begun, waits for the gate,
    then writes one sentence quoting the tag."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.gate = asyncio.Event()
        self.calls = 0

    async def generate_text(self, system: str, user: str) -> str:
        self.calls += 1
        self.entered.set()
        await self.gate.wait()
        return f"Dana tends the {TAG} garden with care."

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        raise NotImplementedError


@pytest.mark.parametrize("renewing", [False, True], ids=["first", "superseding"])
async def test_an_observation_waiting_in_its_model_writes_nothing_once_its_user_is_erased(
    database: Database, fresh_db: PgDatabase, renewing: bool
) -> None:
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    for i in range(3):
        await manager.inject_memory(DANA, f"Dana {TAG} garden fact {i}", entity_ids=["garden"])
    model = GatedObserver()
    if renewing:  # an observation of the garden exists: the new one would supersede it
        model.gate.set()
        assert len(await manager.observe(DANA, model=model)) == 1
        await manager.inject_memory(DANA, f"Dana {TAG} garden fact 3", entity_ids=["garden"])
        model.gate.clear()
        model.entered.clear()
    observing = asyncio.get_running_loop().create_task(manager.observe(DANA, model=model))
    try:
        await asyncio.wait_for(model.entered.wait(), timeout=30)  # in its model call
        receipt = await manager.erase("acme", user_id="dana")
        assert receipt.long_term == (5 if renewing else 3)
        model.gate.set()  # the model answers after the erasure committed
        with pytest.raises(MemoryNotFoundError):
            await asyncio.wait_for(observing, timeout=30)
    finally:
        model.gate.set()
    assert columns_holding(fresh_db, TAG) == set()
    with psycopg.connect(fresh_db.superuser_url) as conn:
        row = conn.execute(
            "select count(*) from harbor.memories where user_id = 'dana' or principal_id = 'dana'"
        ).fetchone()
        assert row == (0,)
