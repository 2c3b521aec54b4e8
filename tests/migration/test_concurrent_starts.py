"""Starting workers against one database: concurrent migrations serialise, and a
start against an up-to-date schema changes nothing and takes no exclusive lock.

Every ``MemoryManager.create()`` runs ``migrate.upgrade()``. Re-creating the
policies takes an ACCESS EXCLUSIVE lock on every table, and several processes
doing it at once deadlocked one another and the requests running meanwhile.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

from harbor_pg.db import migrate
from harbor_pg.db.sqlfiles import query
from tests.conftest import PgDatabase

STARTERS = 8


def _catalog_versions(url: str) -> dict[str, Any]:
    """The row versions (xmin) of every harbor function, policy and table grant:
    re-creating or re-granting any of them changes its row."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """
            select 'proc ' || p.oid::regprocedure::text, p.xmin::text from pg_proc p
             where p.pronamespace = 'harbor'::regnamespace
            union all
            select 'policy ' || pol.polrelid::regclass::text || '.' || pol.polname, pol.xmin::text
              from pg_policy pol
              join pg_class c on c.oid = pol.polrelid
             where c.relnamespace = 'harbor'::regnamespace
            union all
            select 'class ' || c.oid::regclass::text, c.xmin::text from pg_class c
             where c.relnamespace = 'harbor'::regnamespace
            """
        ).fetchall()
    return dict(rows)


def test_start_on_an_up_to_date_schema_takes_no_exclusive_lock_and_changes_nothing(
    fresh_db: PgDatabase,
) -> None:
    before = _catalog_versions(fresh_db.superuser_url)
    done = threading.Event()
    failed: list[BaseException] = []

    def start() -> None:
        try:
            migrate.upgrade(fresh_db.owner_url)
        except BaseException as exc:
            failed.append(exc)
        finally:
            done.set()

    # a request in flight holds the weakest table lock; an exclusive lock waits for it
    reader = psycopg.connect(fresh_db.superuser_url)
    try:
        reader.execute("select count(*) from harbor.memories")
        reader.execute("select count(*) from harbor.messages")
        thread = threading.Thread(target=start, daemon=True)
        t0 = time.perf_counter()
        thread.start()
        finished = done.wait(10)
        elapsed = time.perf_counter() - t0
    finally:
        reader.rollback()
        reader.close()
    thread.join(60)
    assert finished, "upgrade() on an up-to-date schema waited for a reader's lock"
    assert not failed, failed
    assert elapsed < 10
    assert _catalog_versions(fresh_db.superuser_url) == before


_SUBSTRING_MATCHES = (
    "harbor._substring_matches(text, harbor.memory_scope[], timestamptz, integer,"
    " harbor.sensitivity, text)"
)


def test_changed_idempotent_sql_is_applied_again(fresh_db: PgDatabase) -> None:
    # a database whose recorded hash is not the shipped one gets the files again, a
    # function whose columns the package changed included (an earlier release's
    # substring fallback returned no context key: its columns cannot be replaced)
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as conn:
        conn.execute("update public.harbor_idempotent_sql set sha256 = 'older'")
        conn.execute("drop policy messages_read on harbor.messages")
        conn.execute(f"drop function {_SUBSTRING_MATCHES}")
        conn.execute("set role harbor_owner")  # (the package's functions are its)
        conn.execute(
            "create function harbor._substring_matches(p_query text,"
            " p_scopes harbor.memory_scope[], p_as_of timestamptz, p_limit integer,"
            " p_max_sensitivity harbor.sensitivity default 'sensitive',"
            " p_tenant text default null) returns table (tenant_id text, memory_id text,"
            " scope harbor.memory_scope, memory_type harbor.memory_type, importance real,"
            " valid_from timestamptz, content_hash text, entity_ids text[])"
            " language sql stable as $$ select null::text, null::text,"
            " null::harbor.memory_scope, null::harbor.memory_type, null::real,"
            " null::timestamptz, null::text, null::text[] where false $$"
        )
        conn.execute("reset role")
    migrate.upgrade(fresh_db.owner_url)
    with psycopg.connect(fresh_db.superuser_url) as conn:
        policies = conn.execute(
            "select polname from pg_policy where polrelid = 'harbor.messages'::regclass"
        ).fetchall()
        recorded = conn.execute("select sha256 from public.harbor_idempotent_sql").fetchone()
        columns = conn.execute(
            f"select pg_get_function_result('{_SUBSTRING_MATCHES}'::regprocedure)"
        ).fetchone()
    assert ("messages_read",) in policies
    assert columns is not None and columns[0].endswith("context_hash text)"), columns
    from harbor_pg.db.sqlfiles import idempotent_sha256

    assert recorded == (idempotent_sha256(),)


def _start(url: str, barrier: Any, results: Any) -> None:
    try:
        barrier.wait(30)
        migrate.upgrade(url)
        results.put("ok")
    except BaseException as exc:
        results.put(f"{type(exc).__name__}: {exc}")


def _start_many(url: str, n: int) -> list[str]:
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(n)
    results = ctx.Queue()
    procs = [ctx.Process(target=_start, args=(url, barrier, results)) for _ in range(n)]
    for p in procs:
        p.start()
    out = [results.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(30)
    return out


@pytest.mark.parametrize("from_revision", ["head", "0008"])
def test_concurrent_starts_all_succeed(fresh_db: PgDatabase, from_revision: str) -> None:
    if from_revision != "head":
        migrate.downgrade(fresh_db.owner_url, from_revision)
    outcomes = _start_many(fresh_db.owner_url, STARTERS)
    assert outcomes == ["ok"] * STARTERS
    assert migrate.current_revision(fresh_db.owner_url) == migrate.head_revision()


def test_starts_during_load_fail_no_request(fresh_db: PgDatabase) -> None:
    """Requests running while workers start (and re-apply nothing) all succeed."""
    stop = threading.Event()
    errors: list[str] = []
    latencies: list[float] = []

    def client(i: int) -> None:
        with psycopg.connect(fresh_db.app_url) as conn:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    with conn.transaction():
                        conn.execute(
                            "select harbor.set_identity('t1', principal_id => 'u', "
                            "user_id => 'u', session_id => %s, is_local => true)",
                            (f"s{i}",),
                        )
                        conn.execute(
                            "insert into harbor.messages (tenant_id, user_id, session_id, "
                            "project_id, principal_id, role, content) "
                            "values ('t1', 'u', %s, '', 'u', 'user', 'hello')",
                            (f"s{i}",),
                        )
                        conn.execute("select count(*) from harbor.memories").fetchone()
                except psycopg.Error as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                latencies.append(time.perf_counter() - t0)

    clients = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(4)]
    for t in clients:
        t.start()
    try:
        time.sleep(0.3)
        outcomes = _start_many(fresh_db.owner_url, 4)
    finally:
        stop.set()
        for t in clients:
            t.join(30)
    assert outcomes == ["ok"] * 4
    assert errors == []
    assert latencies


START_CHILD = r"""
import asyncio, json, sys
from harbor_pg import HashingEmbedder, MemoryManager

async def main():
    manager = await MemoryManager.create(database_url=sys.argv[1], embedder=HashingEmbedder())
    await manager.close()

asyncio.run(main())
print(json.dumps({m: m in sys.modules for m in ("alembic", "sqlalchemy")}))
"""


def _start_process(url: str) -> dict[str, bool]:
    out = subprocess.run(
        [sys.executable, "-c", START_CHILD, url], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    loaded: dict[str, bool] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def _bookkeeping_versions(url: str) -> dict[str, Any]:
    """Row versions of what bootstrap and migrate would write: the database's
    ACL row, schema public, the roles, the extensions, the two version tables."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """
            select 'database', xmin::text from pg_database where datname = current_database()
            union all select 'schema public', xmin::text from pg_namespace where nspname = 'public'
            union all select 'role ' || rolname, xmin::text from pg_authid
             where rolname like 'harbor%%'
            union all select 'extension ' || extname, xmin::text from pg_extension
            union all select 'revision', xmin::text from public.harbor_alembic_version
            union all select 'sha256', xmin::text from public.harbor_idempotent_sql
            """
        ).fetchall()
    return dict(rows)


def test_create_on_an_up_to_date_server_takes_no_lock_and_writes_nothing(
    fresh_db: PgDatabase,
) -> None:
    """MemoryManager.create() against a server that is bootstrapped and at head
    (a worker starting beside running ones): it completes while another session
    holds the migration advisory lock, an ACCESS EXCLUSIVE lock on every harbor
    table and an EXCLUSIVE lock on both version tables, so it takes none of
    them and writes none of them; it changes no catalog row (no GRANT, no DDL)
    and never loads Alembic."""
    url = fresh_db.superuser_url  # a superuser URL: create() bootstraps, then migrates
    _start_process(url)  # the first start grants the new database's privileges
    before = (_catalog_versions(url), _bookkeeping_versions(url))
    blocker = psycopg.connect(url)
    try:
        blocker.execute(query("migration_lock").replace("_xact", ""))
        tables = blocker.execute(
            "select string_agg(c.oid::regclass::text, ', ') from pg_class c"
            " where c.relnamespace = 'harbor'::regnamespace and c.relkind in ('r', 'p')"
        ).fetchone()
        assert tables is not None and "harbor.memories" in tables[0]
        blocker.execute(f"lock table {tables[0]} in access exclusive mode")
        blocker.execute(
            "lock table public.harbor_alembic_version, public.harbor_idempotent_sql"
            " in exclusive mode"
        )
        loaded = _start_process(url)  # would wait until the timeout for any of those locks
    finally:
        blocker.rollback()
        blocker.execute("select pg_advisory_unlock_all()")
        blocker.close()
    assert loaded == {"alembic": False, "sqlalchemy": False}
    assert (_catalog_versions(url), _bookkeeping_versions(url)) == before


def test_shipped_head_read_without_alembic_is_alembics_head() -> None:
    assert migrate.shipped_head() == migrate.head_revision()
