"""No one but the owner can hold a session's or a run's serialisation lock.

Appending a turn took ``pg_advisory_xact_lock(1751216738, hashtext(tenant,
user, session))`` and a working-state write an advisory lock keyed by its run.
Any login can take any advisory key (and pg_locks lists the held ones), so an
attacker who knew a victim's session could hold its key in an open
transaction and stall every append and working-state write of that session.
The locks are now row locks on ``harbor.owner_locks``, whose policy admits a
row of the caller's own identity only.

Each attacker holds, in one open transaction, every lock it can take that
could touch the victim: the advisory keys exactly as main computed them, the
victim's lock rows (refused), its own lock rows, message and working-state
ids just ahead of the sequence (OVERRIDING SYSTEM VALUE, refused), and a lock
on the whole lock table (refused above ROW EXCLUSIVE). The victim's appends
and working-state writes, through the stores as the application calls them,
must then complete under a lock_timeout instead of waiting.

Not attempted: ``LOCK TABLE`` on messages, working_state and the other tables
where harbor_app holds table-level DELETE or UPDATE; any member of harbor_app
can still take those (docs/security.md, "Not closed").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg import conninfo, sql

from harbor_pg.db.connection import Database
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.short_term import PostgresShortTermStore
from harbor_pg.tiers.working import PostgresWorkingStore
from tests.conftest import PgDatabase
from tests.security.conftest import bind, create_login_roles, drop_roles

BOUND = "harbor_test_lock_squatter"
NO_GRANTS = "harbor_test_lock_no_grants"
#: the victim (user u1) in a session it used before the attack and in one it starts under it
VICTIM_RUN = MemoryOwner(
    tenant_id="t1", project_id="p1", principal_id="u1", session_id="s1", run_id="r1"
)
VICTIM_SESSION = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s1")
VICTIM_NEW = MemoryOwner(tenant_id="t1", principal_id="u1", session_id="s-new")
VICTIM_NEW_RUN = VICTIM_NEW.model_copy(update={"project_id": "p1", "run_id": "r-new"})
#: (tenant, user, session) and (tenant, project, user, session, run) keys to squat
SESSIONS = [("t1", "u1", "s1"), ("t1", "u1", "s-new")]
RUNS = [("t1", "p1", "u1", "s1", "r1"), ("t1", "p1", "u1", "s-new", "r-new")]


def _advisory_keys(conn: psycopg.Connection[Any]) -> None:
    """The keys main's append_message and lock_run took, computed the same way."""
    for t, u, s in SESSIONS:
        conn.execute(
            "select pg_advisory_xact_lock(1751216738,"
            " hashtext(%s::text || chr(31) || %s::text || chr(31) || %s::text))",
            (t, u, s),
        )
    for t, p, u, s, r in RUNS:
        conn.execute(
            "select pg_advisory_xact_lock(hashtextextended("
            "concat_ws(chr(31), 'harbor.working', %s::text, %s::text, %s::text, %s::text,"
            " %s::text), 0))",
            (t, p, u, s, r),
        )


def _attempt(
    conn: psycopg.Connection[Any], taken: list[str], name: str, stmt: str, params: Any = None
) -> None:
    """Run ``stmt`` in a savepoint; keep it (and its locks) if it succeeds."""
    try:
        with conn.transaction():
            conn.execute(stmt, params)
        taken.append(name)
    except psycopg.Error:
        pass


def _squat(conn: psycopg.Connection[Any], bound: bool) -> list[str]:
    """Take, in ``conn``'s open transaction, every lock that could stall the victim;
    returns the names of those taken beyond the advisory keys."""
    _advisory_keys(conn)
    taken: list[str] = []
    for t, u, s in SESSIONS:
        _attempt(
            conn,
            taken,
            f"session row {s}",
            "insert into harbor.owner_locks (tenant_id, user_id, session_id, scope)"
            " values (%s, %s, %s, 'session') on conflict (tenant_id, user_id, session_id,"
            " scope, project_id, run_id) do update set scope = excluded.scope where false",
            (t, u, s),
        )
    for t, p, u, s, r in RUNS:
        _attempt(
            conn,
            taken,
            f"run row {r}",
            "insert into harbor.owner_locks (tenant_id, user_id, session_id, scope, project_id,"
            " run_id) values (%s, %s, %s, 'run', %s, %s) on conflict (tenant_id, user_id,"
            " session_id, scope, project_id, run_id) do update set scope = excluded.scope"
            " where false",
            (t, u, s, p, r),
        )
    _attempt(conn, taken, "rows for update", "select * from harbor.owner_locks for update")
    _attempt(conn, taken, "lock table owner_locks", "lock table harbor.owner_locks in share mode")
    if bound:
        # the attacker's own session and run: its rows to lock, and the ids to aim past
        _attempt(
            conn,
            taken,
            "own session row",
            "insert into harbor.owner_locks (tenant_id, user_id, session_id, scope)"
            " values ('t1', 'u2', 'mine', 'session')",
        )
        top = conn.execute(
            "select (select coalesce(max(id), 0) from harbor.messages),"
            " (select coalesce(max(id), 0) from harbor.working_state)"
        ).fetchone()
        assert top is not None
        for n in range(1, 21):
            _attempt(
                conn,
                taken,
                f"message id +{n}",
                "insert into harbor.messages (id, tenant_id, user_id, session_id, principal_id,"
                " role, content) overriding system value"
                " values (%s, 't1', 'u2', 'mine', 'u2', 'user', 'x')",
                (top[0] + n,),
            )
            _attempt(
                conn,
                taken,
                f"working id +{n}",
                "insert into harbor.working_state (id, tenant_id, project_id, user_id,"
                " session_id, run_id, principal_id) overriding system value"
                " values (%s, 't1', '', 'u2', 'mine', 'r', 'u2')",
                (top[1] + n,),
            )
    return taken


@pytest.fixture(params=["no_grants", "bound"])
def squatter(request: pytest.FixtureRequest, fresh_db: PgDatabase) -> Iterator[Any]:
    """A login with no grants at all, or a role bound to user u2 of the victim's tenant,
    each in an open transaction holding every lock it could take."""
    bound = request.param == "bound"
    if bound:
        create_login_roles(fresh_db, BOUND)
        bind(fresh_db, BOUND, "t1", None, "u2")
        role = BOUND
    else:
        with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
            su.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(NO_GRANTS)))
            su.execute(sql.SQL("create role {} login").format(sql.Identifier(NO_GRANTS)))
            su.execute(
                sql.SQL("grant connect on database {} to {}").format(
                    sql.Identifier(fresh_db.name), sql.Identifier(NO_GRANTS)
                )
            )
        role = NO_GRANTS
    conn = psycopg.connect(fresh_db.url_for(role))
    if bound:
        conn.execute("select harbor.set_identity('t1', session_id => 'mine')")
        conn.commit()
    try:
        yield conn, _squat(conn, bound)
    finally:
        conn.rollback()
        conn.close()
        drop_roles(fresh_db, role)


@pytest_asyncio.fixture
async def victim_db(fresh_db: PgDatabase) -> AsyncIterator[Database]:
    """The application's pool, every wait on a lock cut short (a regression fails)."""
    url = conninfo.make_conninfo(
        fresh_db.app_url, options="-c lock_timeout=3s -c statement_timeout=10s"
    )
    db = Database(url, min_size=1, max_size=2)
    await db.open()
    try:
        yield db
    finally:
        await db.close()


@pytest_asyncio.fixture
async def used_before(victim_db: Database) -> Database:
    """The victim appended and wrote working state before the attack (its lock rows exist)."""
    await PostgresShortTermStore(victim_db).append(
        VICTIM_SESSION, ConversationMessage(role="user", content="before")
    )
    await PostgresWorkingStore(victim_db).update(VICTIM_RUN, {"step": 0}, None)
    return victim_db


async def test_no_other_login_can_stall_a_sessions_appends_or_its_working_state(
    used_before: Database, squatter: Any
) -> None:
    conn, taken = squatter
    short_term = PostgresShortTermStore(used_before)
    working = PostgresWorkingStore(used_before)
    for owner in (VICTIM_SESSION, VICTIM_NEW):
        stored = await short_term.append(owner, ConversationMessage(role="user", content="hi"))
        assert stored.id is not None
        stored, due = await short_term.append_and_check_summary(
            owner,
            ConversationMessage(role="assistant", content="hello"),
            min_turns=20,
            cooldown_seconds=60.0,
        )
        assert stored.id is not None and due is False
    assert await working.update(VICTIM_RUN, {"step": 1}, None) == {"step": 1}
    assert await working.update(VICTIM_NEW_RUN, {"step": 1}, 60.0) == {"step": 1}
    assert [m.content for m in await short_term.recent(VICTIM_SESSION, 10)] == [
        "before",
        "hi",
        "hello",
    ]
    assert [m.content for m in await short_term.recent(VICTIM_NEW, 10)] == ["hi", "hello"]
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS  # still held
    # and nothing it took names the victim (its own session row aside; the select for
    # update finds its own rows only)
    assert set(taken) <= {"rows for update", "own session row"}, taken


def test_a_bound_role_locks_only_its_own_rows(fresh_db: PgDatabase) -> None:
    """The policy admits a proposed lock row of the caller's own session or run only."""
    create_login_roles(fresh_db, BOUND)
    bind(fresh_db, BOUND, "t1", None, "u2")
    try:
        with psycopg.connect(fresh_db.url_for(BOUND)) as conn:
            conn.execute("select harbor.set_identity('t1', session_id => 'mine', run_id => 'r')")
            conn.execute(
                "insert into harbor.owner_locks (tenant_id, user_id, session_id, scope)"
                " values ('t1', 'u2', 'mine', 'session')"
            )
            conn.execute(
                "insert into harbor.owner_locks (tenant_id, user_id, session_id, scope, run_id)"
                " values ('t1', 'u2', 'mine', 'run', 'r')"
            )
            for key in (("t1", "u1", "mine"), ("t1", "u2", "other"), ("t2", "u2", "mine")):
                with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
                    conn.execute(
                        "insert into harbor.owner_locks (tenant_id, user_id, session_id, scope)"
                        " values (%s, %s, %s, 'session')",
                        key,
                    )
            for stmt in (
                "lock table harbor.owner_locks in share mode",
                "delete from harbor.owner_locks",
                "update harbor.owner_locks set run_id = ''",
                "truncate harbor.owner_locks",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
                    conn.execute(stmt)
            rows = conn.execute(
                "select user_id, session_id, scope::text, run_id from harbor.owner_locks"
            ).fetchall()
            assert sorted(rows) == [("u2", "mine", "run", "r"), ("u2", "mine", "session", "")]
    finally:
        drop_roles(fresh_db, BOUND)
