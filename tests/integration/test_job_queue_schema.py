"""The job queue's schema: procrastinate's tables in harbor_jobs, who may touch them."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.conftest import PgDatabase

_DEFER = (
    "select harbor_jobs.procrastinate_defer_jobs_v1(array[row('harbor', 'harbor.test', 0,"
    " null, null, %s::jsonb, null)::harbor_jobs.procrastinate_job_to_defer_v1])"
)


def _as_app(db: PgDatabase, tenant: str, user: str, session: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(db.app_url)
    conn.execute(
        "select harbor.set_identity(tenant_id => %s, principal_id => %s, session_id => %s,"
        " is_local => true)",
        (tenant, user, session),
    )
    return conn


def _args(tenant: str, user: str, session: str, **extra: Any) -> str:
    owner = {"tenant_id": tenant, "principal_id": user, "user_id": user, "session_id": session}
    return json.dumps({**owner, **extra})


def test_a_migrated_database_has_procrastinate_tables(fresh_db: PgDatabase) -> None:
    with psycopg.connect(fresh_db.superuser_url) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "select tablename from pg_tables where schemaname = 'harbor_jobs'"
            ).fetchall()
        }
    assert {"procrastinate_jobs", "procrastinate_events", "procrastinate_workers"} <= tables


def test_the_application_enqueues_and_reads_only_its_own_jobs(fresh_db: PgDatabase) -> None:
    with _as_app(fresh_db, "t1", "alice", "s1") as conn:
        [ids] = conn.execute(_DEFER, (_args("t1", "alice", "s1", message_id=7),)).fetchone()
        conn.commit()
    assert len(ids) == 1
    with _as_app(fresh_db, "t1", "bob", "s1") as conn:
        seen = conn.execute("select id from harbor_jobs.procrastinate_jobs").fetchall()
        assert seen == []
        # a job for anyone else's identity is refused
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(_DEFER, (_args("t1", "alice", "s1"),))
    with _as_app(fresh_db, "t1", "alice", "s1") as conn:
        rows = conn.execute("select id, args from harbor_jobs.procrastinate_jobs").fetchall()
        assert [r[0] for r in rows] == ids
        assert rows[0][1]["message_id"] == 7
        # the application reads no worker state and no job's lock
        for statement in (
            "select * from harbor_jobs.procrastinate_workers",
            "select lock from harbor_jobs.procrastinate_jobs",
            "select * from harbor_jobs.procrastinate_events",
            "select * from harbor_jobs.job_errors",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
            conn.rollback()
            conn.execute(
                "select harbor.set_identity(tenant_id => 't1', principal_id => 'alice',"
                " session_id => 's1', is_local => true)"
            )
        # nor can it change a job
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("update harbor_jobs.procrastinate_jobs set status = 'failed'")


def test_the_worker_role_sees_every_job_and_its_events(fresh_db: PgDatabase) -> None:
    for user in ("alice", "bob"):
        with _as_app(fresh_db, "t1", user, "s1") as conn:
            conn.execute(_DEFER, (_args("t1", user, "s1"),))
            conn.commit()
    with psycopg.connect(fresh_db.admin_url) as conn:
        users = conn.execute(
            "select args ->> 'user_id' from harbor_jobs.procrastinate_jobs order by id"
        ).fetchall()
        events = conn.execute(
            "select type::text from harbor_jobs.procrastinate_events order by id"
        ).fetchall()
    assert users == [("alice",), ("bob",)]
    assert events == [("deferred",), ("deferred",)]


def test_public_has_nothing_on_the_queue(fresh_db: PgDatabase) -> None:
    with psycopg.connect(fresh_db.superuser_url) as conn:
        conn.execute("create role harbor_test_stranger login")
        conn.execute(f'grant connect on database "{fresh_db.name}" to harbor_test_stranger')
        conn.commit()
    try:
        stranger = fresh_db.url_for("harbor_test_stranger")
        with (
            psycopg.connect(stranger) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute("select count(*) from harbor_jobs.procrastinate_jobs")
    finally:
        with psycopg.connect(fresh_db.superuser_url, autocommit=True) as conn:
            conn.execute(f'revoke connect on database "{fresh_db.name}" from harbor_test_stranger')
            conn.execute("drop role harbor_test_stranger")
