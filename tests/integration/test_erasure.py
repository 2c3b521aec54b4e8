"""Erasure leaves no trace of the erased text in any table."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from harbor_pg.db.connection import Database
from harbor_pg.errors import MemoryValidationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.tiers.base import RetentionReceipt
from tests.conftest import PgDatabase

SECRET = "zebra-umbrella-7731"
ALICE = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1", run_id="r1")
ALICE_S2 = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s2", run_id="r1")
BOB = MemoryOwner(tenant_id="t1", principal_id="bob", session_id="s1", run_id="r1")


def tables_containing(db: PgDatabase, needle: str) -> list[str]:
    found = []
    with psycopg.connect(db.superuser_url) as conn:
        tables = conn.execute(
            "select format('%I.%I', schemaname, tablename) from pg_tables"
            " where schemaname not in ('pg_catalog', 'information_schema')"
        ).fetchall()
        for (table,) in tables:
            row = conn.execute(
                f"select count(*) from {table} t where to_jsonb(t)::text like %s",
                (f"%{needle}%",),
            ).fetchone()
            if row and row[0]:
                found.append(table)
    return found


def run_locks(db: PgDatabase) -> list[tuple[str, str]]:
    """(tenant, session) of the runs' serialisation lock rows (harbor.owner_locks)."""
    with psycopg.connect(db.superuser_url) as conn:
        rows = conn.execute(
            "select tenant_id, session_id from harbor.owner_locks where scope = 'run' order by 1, 2"
        ).fetchall()
    return [(str(t), str(s)) for t, s in rows]


async def fill(manager: MemoryManager, owner: MemoryOwner, text: str) -> None:
    await manager.append(owner, ConversationMessage(role="user", content=f"my code is {text}"))
    await manager.update(owner, {"note": text}, ttl_seconds=3600)
    await manager.save(
        owner,
        Memory(content=f"Alice's code is {text}"),
        embedding=[1.0, 0.0, 0.0],
        model_id="test-3d",
    )
    await manager.save(owner, Memory(content=f"session note {text}", scope="session"))


async def test_erase_user_removes_every_trace(database: Database, fresh_db: PgDatabase) -> None:
    manager = MemoryManager.from_database(database)
    await fill(manager, ALICE, SECRET)
    await fill(manager, ALICE_S2, SECRET + "-s2")
    await fill(manager, BOB, "bob-keeps-this")
    assert set(tables_containing(fresh_db, SECRET)) >= {
        "harbor.messages",
        "harbor.working_state",
        "harbor.memories",
    }
    receipt = await manager.erase("t1", user_id="alice")
    assert (receipt.short_term, receipt.working, receipt.long_term, receipt.embeddings) == (
        2,
        2,
        4,
        2,
    )
    assert tables_containing(fresh_db, SECRET) == []
    assert tables_containing(fresh_db, "bob-keeps-this") != []


async def test_erase_one_session(database: Database, fresh_db: PgDatabase) -> None:
    manager = MemoryManager.from_database(database)
    await fill(manager, ALICE, SECRET)
    await fill(manager, ALICE_S2, "other-session-stays")
    receipt = await manager.erase("t1", user_id="alice", session_id="s1")
    assert receipt.short_term == 1 and receipt.working == 1 and receipt.long_term == 1
    assert [m.content for m in await manager.recent(ALICE_S2)] == ["my code is other-session-stays"]
    assert tables_containing(fresh_db, "session note " + SECRET) == []


DANA = MemoryOwner(
    tenant_id="t1", project_id="p1", principal_id="dana", session_id="s1", run_id="r1"
)
DANA_S2 = DANA.model_copy(update={"session_id": "s2"})
ERIN = MemoryOwner(
    tenant_id="t1", project_id="p1", principal_id="erin", session_id="s1", run_id="r1"
)
#: an assistant acting for Dana in her session (its own principal, Dana's user key)
# (one shape with the owners of conformance.py and test_portability_fields.py, on
# purpose: each test states its own data)
BOT = MemoryOwner(
    tenant_id="t1",
    project_id="p1",
    principal_id="helper-bot",
    user_id="dana",
    session_id="s1",
    run_id="bot-run",
)


async def fill_with_derived(manager: MemoryManager, owner: MemoryOwner, text: str) -> None:
    """fill(), plus a PROJECT note and facts derived from the session's turn."""
    await fill(manager, owner, text)
    [turn] = await manager.recent(owner, 1)
    await manager.save(
        owner,
        Memory(content=f"Dana project note {text}", scope="project"),
        embedding=[0.0, 1.0, 0.0],
        model_id="test-3d",
    )
    # facts extracted from the session: one by Dana's own extractor, one by the agent
    await manager.save(
        owner,
        Memory(
            content=f"Derived project fact {text}",
            scope="project",
            source_session_id=owner.session_id,
            source_message_ids=[str(turn.id)],
        ),
        embedding=[0.0, 0.0, 1.0],
        model_id="test-3d",
    )
    await manager.save(
        BOT.model_copy(update={"session_id": owner.session_id}),
        Memory(
            content=f"Agent noted for the project: {text}",
            scope="project",
            source_session_id=owner.session_id,
            source_message_ids=[str(turn.id)],
        ),
        embedding=[0.5, 0.5, 0.0],
        model_id="test-3d",
    )


async def test_erase_user_removes_project_rows_and_derived_facts(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(database)
    await fill_with_derived(manager, DANA, SECRET)
    await fill_with_derived(manager, DANA_S2, SECRET + "-s2")
    await fill(manager, ERIN, "erin-keeps-this")
    await manager.save(ERIN, Memory(content="Erin project note erin-keeps-this", scope="project"))
    assert "harbor.memories" in tables_containing(fresh_db, "Dana project note " + SECRET)
    receipt = await manager.erase("t1", user_id="dana")
    # per session: 1 turn, 1 run, 2 + 3 memories, 1 + 3 embeddings
    assert (receipt.short_term, receipt.working, receipt.long_term, receipt.embeddings) == (
        2,
        2,
        10,
        8,
    )
    assert tables_containing(fresh_db, SECRET) == []
    assert tables_containing(fresh_db, "dana") == []
    erin = [m.content for m in await manager.search(ERIN, "erin-keeps-this")]
    assert sorted(erin) == [
        "Alice's code is erin-keeps-this",
        "Erin project note erin-keeps-this",
        "session note erin-keeps-this",
    ]


async def test_erase_session_removes_memories_derived_from_it(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(database)
    await fill_with_derived(manager, DANA, SECRET)
    await fill_with_derived(manager, DANA_S2, "other-session-stays")
    receipt = await manager.erase("t1", user_id="dana", session_id="s1")
    # the session note, the two derived facts and their 2 vectors go; the USER fact and
    # the PROJECT note Dana wrote in s1 carry no session and stay (erase the user for them)
    assert (receipt.short_term, receipt.working, receipt.long_term, receipt.embeddings) == (
        1,
        1,
        3,
        2,
    )
    assert tables_containing(fresh_db, "Derived project fact " + SECRET) == []
    assert tables_containing(fresh_db, "Agent noted for the project: " + SECRET) == []
    assert tables_containing(fresh_db, "my code is " + SECRET) == []
    assert tables_containing(fresh_db, "other-session-stays") != []
    assert [m.content for m in await manager.recent(DANA_S2)] == ["my code is other-session-stays"]


async def test_erase_agent_memories(database: Database, fresh_db: PgDatabase) -> None:
    manager = MemoryManager.from_database(database)
    bot = MemoryOwner(
        tenant_id="t1", principal_id="support-bot", user_id="carol", session_id="s1", run_id="r1"
    )
    await fill(manager, bot, SECRET)
    await fill(manager, BOB, "bob-keeps-this")
    receipt = await manager.erase_agent_memories("t1", "support-bot")
    assert receipt.long_term == 2
    assert tables_containing(fresh_db, SECRET) == []


async def test_erase_needs_a_subject(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    with pytest.raises(MemoryValidationError):
        await manager.erase("t1")


def working_rows(db: PgDatabase) -> list[tuple[str, str]]:
    """(tenant, run) of every working_state row, hidden (expired) ones included."""
    with psycopg.connect(db.superuser_url) as conn:
        rows = conn.execute(
            "select tenant_id, session_id from harbor.working_state order by 1, 2"
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


async def test_retention_purges_expired_working_state_and_old_memories(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(database)
    other_tenant = ALICE.model_copy(update={"tenant_id": "t2"})
    await manager.inject_memory(ALICE, "old pii fact", sensitivity="pii")
    await manager.inject_memory(ALICE, "old plain fact")
    await manager.update(ALICE, {"x": 1}, ttl_seconds=0.01)
    await manager.update(ALICE_S2, {"y": 2}, ttl_seconds=3600)
    await manager.update(other_tenant, {"z": 3}, ttl_seconds=0.01)
    await asyncio.sleep(0.05)
    assert working_rows(fresh_db) == [("t1", "s1"), ("t1", "s2"), ("t2", "s1")]

    assert run_locks(fresh_db) == [("t1", "s1"), ("t1", "s2"), ("t2", "s1")]
    # without an age: only the tenant's expired working state goes (with its run's lock row)
    assert await manager.apply_retention("t1") == RetentionReceipt(working=1, long_term=0)
    assert working_rows(fresh_db) == [("t1", "s2"), ("t2", "s1")]
    assert run_locks(fresh_db) == [("t1", "s2"), ("t2", "s1")]
    assert len(await manager.search(ALICE, "old fact")) == 2
    assert await manager.scratch(ALICE_S2) == {"y": 2}

    assert await manager.apply_retention("t1", max_age_seconds=3600) == RetentionReceipt(0, 0)
    receipt = await manager.apply_retention("t1", max_age_seconds=0, min_sensitivity="pii")
    assert receipt == RetentionReceipt(working=0, long_term=1)
    assert [m.content for m in await manager.search(ALICE, "old fact")] == ["old plain fact"]

    # the other tenant's expired row is its own retention's business, or the global purge's
    assert await manager.apply_retention("t2") == RetentionReceipt(working=1, long_term=0)
    await manager.update(ALICE, {"x": 1}, ttl_seconds=0.01)
    await asyncio.sleep(0.05)
    assert await manager.purge_working_state() == 1
    assert working_rows(fresh_db) == [("t1", "s2")]


async def test_retention_rejects_incoherent_requests(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    with pytest.raises(MemoryValidationError):
        await manager.apply_retention("t1", max_age_seconds=-1)
    with pytest.raises(MemoryValidationError):
        await manager.apply_retention("t1", max_age_seconds=float("nan"))
    with pytest.raises(MemoryValidationError):
        await manager.apply_retention("t1", scope="user")  # an age is needed
    with pytest.raises(MemoryValidationError):
        await manager.apply_retention("t1", max_age_seconds=1, min_sensitivity="secret")
    # the SQL function checks the same on its own
    async with database.transaction(MemoryOwner(tenant_id="t1"), admin=True) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            await conn.execute("select * from harbor.apply_retention(only_scope => 'user')")


async def test_failure_mid_save_leaves_nothing(database: Database, fresh_db: PgDatabase) -> None:
    manager = MemoryManager.from_database(database)
    # the memory row is inserted first; the embedding then violates the dims check
    with pytest.raises(MemoryValidationError):
        await manager.save(
            ALICE,
            Memory(content="half written " + SECRET),
            embedding=[0.5] * 16001,
            model_id="too-big",
        )
    assert tables_containing(fresh_db, SECRET) == []
