"""On the cluster, a turn queued with its jobs: stored by the append's delegated call (on
the tenant's worker) and its jobs queued on the coordinator, in one transaction. It and a
delegated append of the same session keep the session's ids in the order the turns were
stored; its jobs are the rows queue_turn_jobs makes for it; a failed job insert leaves no
turn; and the call checks the identity as the plain append's does."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from psycopg import errors

from harbor_pg.db.connection import Database, carried_identity, identity_params
from harbor_pg.db.sqlfiles import query
from harbor_pg.errors import MemoryDatabaseError
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import bound_login
from tests.integration.test_jobs_append import TeaModel

OWNER = MemoryOwner(tenant_id="jobs-order", principal_id="ann", session_id="s1")


async def test_queued_and_delegated_appends_keep_the_sessions_order(
    cluster_db: ClusterDatabase,
) -> None:
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
        conn.execute("delete from harbor.messages where tenant_id = %s", (OWNER.tenant_id,))
    databases = [
        Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=2) for _ in range(2)
    ]
    for database in databases:
        await database.open()
    queued = MemoryManager.from_database(
        databases[0],
        extraction_model=TeaModel(),
        config=MemoryManagerConfig(jobs_in_process=False),
    )
    plain = MemoryManager.from_database(databases[1])
    try:
        ids: list[int] = []
        for k in range(6):
            manager = queued if k % 2 else plain
            stored = await manager.append(
                OWNER, ConversationMessage(role="user", content=f"turn {k}: I like tea")
            )
            assert stored.id is not None
            ids.append(stored.id)
        # stored one after another: each id above the one before, whichever way it came
        assert ids == sorted(ids) and len(set(ids)) == 6
        recent = await plain.recent(OWNER)
        assert [m.content for m in recent] == [f"turn {k}: I like tea" for k in range(6)]
        # the queued turns have their extraction jobs, the others none
        with psycopg.connect(cluster_db.superuser_url) as conn:
            rows = conn.execute(
                "select (args->>'message_id')::bigint from harbor_jobs.procrastinate_jobs"
                " where task_name = 'harbor.extract_turn' and args->>'tenant_id' = %s",
                (OWNER.tenant_id,),
            ).fetchall()
        assert sorted(r[0] for r in rows) == [ids[1], ids[3], ids[5]]
    finally:
        for manager in (queued, plain):
            await manager.close()
        for database in databases:
            await database.close()


def _jobs(db: ClusterDatabase, tenant: str) -> list[tuple[Any, ...]]:
    """The queue's rows of ``tenant``'s jobs, by id."""
    with psycopg.connect(db.superuser_url) as conn:
        return conn.execute(
            "select id, queue_name, task_name, priority, lock, args, status"
            "  from harbor_jobs.procrastinate_jobs where args->>'tenant_id' = %s order by id",
            (tenant,),
        ).fetchall()


def _turns(db: ClusterDatabase, tenant: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db.superuser_url) as conn:
        return conn.execute(
            "select id, user_id, session_id, content from harbor.messages"
            " where tenant_id = %s order by id",
            (tenant,),
        ).fetchall()


def _append_with_jobs(
    db: ClusterDatabase, owner: MemoryOwner, content: str, **jobs: Any
) -> tuple[ConversationMessage, bool, list[int]]:
    async def run() -> tuple[ConversationMessage, bool, list[int]]:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
        await database.open()
        try:
            return await PostgresShortTermStore(database).append_with_jobs(
                owner, ConversationMessage(role="user", content=content), **jobs
            )
        finally:
            await database.close()

    return asyncio.run(run())


def test_the_jobs_queued_are_the_turns_own_rows(cluster_db: ClusterDatabase) -> None:
    owner = MemoryOwner(tenant_id="jobs-rows", principal_id="ann", session_id="s1", run_id="r1")
    lock = "harbor-session:jobs-rows\x1fann\x1fs1"
    ids = {
        "tenant_id": "jobs-rows",
        "project_id": "",
        "principal_id": "ann",
        "user_id": "ann",
        "session_id": "s1",
        "run_id": "r1",
    }
    # a summary due from the second turn: the first queues its extraction alone
    first, due, first_jobs = _append_with_jobs(
        cluster_db, owner, "one", min_turns=2, cooldown_seconds=0.0, extract=True, fold=True
    )
    assert not due and len(first_jobs) == 1
    # the second its extraction and the session's summary fold, in that order
    second, due, second_jobs = _append_with_jobs(
        cluster_db, owner, "two", min_turns=2, cooldown_seconds=0.0, extract=True, fold=True
    )
    assert due and len(second_jobs) == 2
    # with slots: the lock a slot's, the same for every turn of the session
    third, _due, third_jobs = _append_with_jobs(
        cluster_db,
        owner,
        "three",
        min_turns=100,
        cooldown_seconds=0.0,
        extract=True,
        fold=True,
        slots=3,
    )
    assert len(third_jobs) == 1
    with psycopg.connect(cluster_db.superuser_url) as conn:
        [(slot,)] = conn.execute(
            "select 'harbor-slot:' || abs(hashtext(%s) %% 3)", (lock.split(":", 1)[1],)
        ).fetchall()
    assert _jobs(cluster_db, "jobs-rows") == [
        (
            first_jobs[0],
            "harbor",
            "harbor.extract_turn",
            0,
            lock,
            {**ids, "message_id": first.id},
            "todo",
        ),
        (
            second_jobs[0],
            "harbor",
            "harbor.extract_turn",
            0,
            lock,
            {**ids, "message_id": second.id},
            "todo",
        ),
        (second_jobs[1], "harbor", "harbor.fold_summary", 0, lock, ids, "todo"),
        (
            third_jobs[0],
            "harbor",
            "harbor.extract_turn",
            0,
            slot,
            {**ids, "message_id": third.id},
            "todo",
        ),
    ]
    assert [t[3] for t in _turns(cluster_db, "jobs-rows")] == ["one", "two", "three"]


def test_a_failed_job_insert_leaves_no_turn(cluster_db: ClusterDatabase) -> None:
    owner = MemoryOwner(tenant_id="jobs-fail", principal_id="ann", session_id="s1")
    _append_with_jobs(
        cluster_db, owner, "kept", min_turns=100, cooldown_seconds=0.0, extract=True, fold=False
    )
    before = (_turns(cluster_db, "jobs-fail"), _jobs(cluster_db, "jobs-fail"))
    assert len(before[0]) == 1 and len(before[1]) == 1
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
        conn.execute(
            "create function harbor_jobs.test_refuse_jobs_fail() returns trigger"
            " language plpgsql as $$ begin"
            " if new.args->>'tenant_id' = 'jobs-fail' then"
            "   raise exception 'test: no jobs for jobs-fail' using errcode = 'P0001';"
            " end if; return new; end $$"
        )
        conn.execute(
            "create trigger test_refuse_jobs_fail before insert on harbor_jobs.procrastinate_jobs"
            " for each row execute function harbor_jobs.test_refuse_jobs_fail()"
        )
    try:
        with pytest.raises(MemoryDatabaseError, match="no jobs for jobs-fail"):
            _append_with_jobs(
                cluster_db,
                owner,
                "gone",
                min_turns=100,
                cooldown_seconds=0.0,
                extract=True,
                fold=False,
            )
    finally:
        with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
            conn.execute("drop trigger test_refuse_jobs_fail on harbor_jobs.procrastinate_jobs")
            conn.execute("drop function harbor_jobs.test_refuse_jobs_fail()")
    # the turn rolled back with its jobs, on the worker as on the coordinator
    assert (_turns(cluster_db, "jobs-fail"), _jobs(cluster_db, "jobs-fail")) == before
    # and the session's lock was let go: the next append goes through
    after, _due, jobs = _append_with_jobs(
        cluster_db, owner, "next", min_turns=100, cooldown_seconds=0.0, extract=True, fold=False
    )
    assert after.id is not None and after.id > before[0][0][0] and len(jobs) == 1


BOUND_ROLE = "harbor_test_jobs_bound"


def _bound_append(db: ClusterDatabase, role: str, carried: MemoryOwner) -> list[int]:
    """``role`` appends a turn with its extraction queued as the facade does on Citus (in a
    transaction block: the delegated call, the identity on the coordinator, the queue),
    the call and the coordinator's identity naming ``carried``; the jobs' ids."""
    params = {
        **carried_identity(carried),
        "role": "user",
        "content": "from a bound login",
        "name": None,
        "tool_calls": psycopg.types.json.Jsonb([]),
        "tool_call_id": None,
        "metadata": psycopg.types.json.Jsonb({}),
        "token_estimate": 4,
        "min_turns": 100,
        "cooldown_seconds": 0.0,
    }
    with psycopg.connect(db.url_for(role)) as conn:
        [(turn_id, _created, due)] = conn.execute(query("append_turn_delegated"), params).fetchall()
        conn.execute(query("set_identity"), identity_params(carried))
        [(job_ids,)] = conn.execute(
            query("queue_turn_jobs_citus"),
            {"turn_id": turn_id, "summary_due": due, "extract": True, "fold": False, "slots": 0},
        ).fetchall()
    return list(job_ids or ())


def test_a_bound_login_naming_another_user_stores_and_queues_nothing(
    cluster_db: ClusterDatabase,
) -> None:
    ann = MemoryOwner(tenant_id="jobs-bound", principal_id="ann", session_id="s1")
    carl = MemoryOwner(tenant_id="jobs-bound", principal_id="carl", session_id="s1")
    with bound_login(cluster_db, BOUND_ROLE, "jobs-bound", "ann") as role:
        # its own append: the turn stored, the job queued as the binding's (the coordinator
        # reads the binding first, as the worker does)
        [job] = _bound_append(cluster_db, role, ann)
        [row] = [r for r in _jobs(cluster_db, "jobs-bound") if r[0] == job]
        assert row[5]["user_id"] == "ann" and row[5]["session_id"] == "s1"
        before = (_turns(cluster_db, "jobs-bound"), _jobs(cluster_db, "jobs-bound"))
        assert [t[1] for t in before[0]] == ["ann"]
        # naming carl in the call: refused by the call on the worker, nothing written
        with pytest.raises(errors.InsufficientPrivilege, match="not the caller's"):
            _bound_append(cluster_db, role, carl)
        assert (_turns(cluster_db, "jobs-bound"), _jobs(cluster_db, "jobs-bound")) == before
