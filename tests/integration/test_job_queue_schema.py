"""The job queue's schema: procrastinate's tables in harbor_jobs, who may touch them."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from tests.conftest import PgDatabase
from tests.security.conftest import bind, create_login_roles, drop_roles

#: queue a turn's extraction (turn 7) as the caller: the application's one way onto the queue
_QUEUE = "select harbor_jobs.queue_turn_jobs(7, true, false, 0)"
#: procrastinate's own enqueue, which the application may no longer call
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
        [ids] = conn.execute(_QUEUE).fetchone()
        conn.commit()
    assert len(ids) == 1
    with _as_app(fresh_db, "t1", "bob", "s1") as conn:
        seen = conn.execute("select id from harbor_jobs.procrastinate_jobs").fetchall()
        assert seen == []
    with _as_app(fresh_db, "t1", "alice", "s1") as conn:
        rows = conn.execute("select id, args from harbor_jobs.procrastinate_jobs").fetchall()
        assert [r[0] for r in rows] == ids
        assert rows[0][1] == json.loads(_args("t1", "alice", "s1", message_id=7)) | {
            "project_id": "",
            "run_id": "",
        }
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


def test_the_application_writes_to_the_queue_only_through_queue_turn_jobs(
    fresh_db: PgDatabase,
) -> None:
    attempts = (
        (_DEFER, (_args("t1", "alice", "s1"),)),
        (
            "insert into harbor_jobs.procrastinate_jobs (queue_name, task_name, args)"
            " values ('harbor', 'harbor.extract_turn', %s::jsonb)",
            (_args("t1", "alice", "s1", message_id=1),),
        ),
        (
            "insert into harbor_jobs.procrastinate_events (job_id, type) values (1, 'deferred')",
            None,
        ),
        ("select * from harbor_jobs.caller_ids()", None),
    )
    for statement, params in attempts:
        with (
            _as_app(fresh_db, "t1", "alice", "s1") as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute(statement, params)
    with psycopg.connect(fresh_db.admin_url) as conn:
        assert conn.execute("select count(*) from harbor_jobs.procrastinate_jobs").fetchone() == (
            0,
        )


def test_a_caller_without_a_session_queues_nothing(fresh_db: PgDatabase) -> None:
    with psycopg.connect(fresh_db.app_url) as conn:
        assert conn.execute(_QUEUE).fetchone() == (None,)
        conn.execute(
            "select harbor.set_identity(tenant_id => 't1', principal_id => 'alice',"
            " is_local => true)"
        )
        assert conn.execute(_QUEUE).fetchone() == (None,)
        conn.commit()
    with psycopg.connect(fresh_db.admin_url) as conn:
        assert conn.execute("select count(*) from harbor_jobs.procrastinate_jobs").fetchone() == (
            0,
        )


def test_a_bound_role_queues_jobs_as_its_binding_whatever_identity_it_sets(
    fresh_db: PgDatabase,
) -> None:
    """The queue function runs as the queue's owner, and still reads the caller's
    binding, not the identity the caller set: a job runs as whoever queued it."""
    create_login_roles(fresh_db, "jobs_bound_user", "jobs_bound_tenant", "jobs_login")
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as conn:
        conn.execute("grant jobs_bound_user to jobs_login")
    try:
        bind(fresh_db, "jobs_bound_user", "t1", None, "alice")
        bind(fresh_db, "jobs_bound_tenant", "t1", None, None)
        queued: list[Any] = []
        for login in ("jobs_bound_user", "jobs_login"):
            with psycopg.connect(fresh_db.url_for(login)) as conn:
                if login == "jobs_login":  # a login of its own that takes the bound role
                    conn.execute("set role jobs_bound_user")
                # harbor.set_identity refuses a bound role another identity; the settings
                # it writes are open to anyone
                for name, value in (
                    ("tenant_id", "t2"),
                    ("principal_id", "mallory"),
                    ("user_id", "mallory"),
                    ("session_id", "s9"),
                ):
                    conn.execute("select set_config('harbor.' || %s, %s, true)", (name, value))
                [ids] = conn.execute(_QUEUE).fetchone()
                assert len(ids) == 1
                conn.commit()
                queued += ids
        with psycopg.connect(fresh_db.url_for("jobs_bound_tenant")) as conn:
            for name, value in (("principal_id", "alice"), ("session_id", "s1")):
                conn.execute("select set_config('harbor.' || %s, %s, true)", (name, value))
            # bound to a tenant with no user: no session is its own, so no job either
            assert conn.execute(_QUEUE).fetchone() == (None,)
            conn.commit()
        with psycopg.connect(fresh_db.admin_url) as conn:
            rows = conn.execute(
                "select args from harbor_jobs.procrastinate_jobs order by id"
            ).fetchall()
        owner = {"tenant_id": "t1", "user_id": "alice", "principal_id": "alice"}
        # the bound user picks its own session (s9), never its tenant or user
        assert [r[0] for r in rows] == [
            {**owner, "session_id": "s9", "project_id": "", "run_id": "", "message_id": 7}
        ] * 2
        assert len(queued) == 2
    finally:
        drop_roles(fresh_db, "jobs_login", "jobs_bound_user", "jobs_bound_tenant")


def test_the_worker_role_sees_every_job_and_its_events(fresh_db: PgDatabase) -> None:
    for user in ("alice", "bob"):
        with _as_app(fresh_db, "t1", user, "s1") as conn:
            conn.execute(_QUEUE)
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
