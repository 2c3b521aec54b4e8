"""On the cluster, a turn's append is one call that Citus delegates to the tenant's
worker (harbor.append_turn, sql/citus/append.sql): one command reaches the worker and no
other node; the identity it carries as arguments is checked there against the caller's
binding, so a bound role that names another tenant, user or session is refused and
nothing of theirs is read or written; turns appended concurrently keep their commit
order within a session."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.types.json import Jsonb

from harbor_pg.db.connection import Database, local_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.citus.conftest import ClusterDatabase
from tests.citus.test_cluster_routing import _facade_commands, _queries
from tests.integration.test_turn_order import follow_concurrent_appends

ANN = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s1")
BOB = MemoryOwner(tenant_id="append-b", principal_id="bob", session_id="s1")
ROLE = "harbor_test_append_bound"


def _call(owner: MemoryOwner, content: str, **overrides: Any) -> dict[str, Any]:
    """append_turn_delegated's parameters for a turn of ``owner`` (``overrides``: the
    arguments an attacker changes)."""
    return {
        "tenant_id": owner.tenant_id,
        "project_id": "",
        "principal_id": owner.principal_id,
        "user_id": owner.user_id,
        "session_id": owner.session_id,
        "run_id": "",
        "role": "user",
        "content": content,
        "name": None,
        "tool_calls": Jsonb([]),
        "tool_call_id": None,
        "metadata": Jsonb({}),
        "token_estimate": 1,
        "min_turns": None,
        "cooldown_seconds": None,
        **overrides,
    }


def _turns(url: str, tenant: str) -> list[tuple[str, str, str]]:
    """Every turn of ``tenant`` (read as a superuser): (user, session, content)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "select user_id, session_id, content from harbor.messages where tenant_id = %s"
            " order by id",
            (tenant,),
        ).fetchall()
    return [(str(u), str(s), str(c)) for u, s, c in rows]


def _locks(url: str, tenant: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select count(*) from harbor.owner_locks where tenant_id = %s", (tenant,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_facades_append_is_one_call_on_the_tenants_worker(
    cluster_db: ClusterDatabase,
) -> None:
    # Citus's log of the commands the coordinator sends: the append (with its summary
    # check: the facade's default) is one command, the function's call, to the tenant's
    # worker; no BEGIN, SET LOCAL or COMMIT, and no other node
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s-one-hop")

    async def run(manager: MemoryManager) -> None:
        await manager.append(owner, ConversationMessage(role="user", content="hello there"))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    port = cluster_db.node_of(owner.tenant_id).port
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == port
    assert re.match(r"SELECT .* FROM harbor\.append_turn\('append-a'::text", command), command
    assert _queries(sent) == sent
    assert ("ann", "s-one-hop", "hello there") in _turns(cluster_db.superuser_url, "append-a")


def test_the_delegated_append_answers_as_the_statements_did(cluster_db: ClusterDatabase) -> None:
    # the stored turn comes back with its id and time; the summary check counts it
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s-due")

    async def run() -> list[tuple[int, bool]]:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        store = PostgresShortTermStore(db)
        out = []
        try:
            for n in range(3):
                stored, due = await store.append_and_check_summary(
                    owner,
                    ConversationMessage(role="user", content=f"turn {n}"),
                    min_turns=2,
                    cooldown_seconds=0,
                )
                assert stored.id is not None and stored.created_at is not None
                out.append((int(stored.id), due))
            plain = await store.append(owner, ConversationMessage(role="user", content="last"))
            assert plain.id is not None and plain.id > out[-1][0]
            recent = await store.recent(owner, 10)
        finally:
            await db.close()
        assert [m.content for m in recent] == ["turn 0", "turn 1", "turn 2", "last"]
        return out

    appended = asyncio.run(run())
    assert [due for _id, due in appended] == [False, True, True]
    assert [i for i, _due in appended] == sorted(i for i, _due in appended)


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant append-a as user ann (an application's own role), with
    what such a role is given: harbor_app's rights, without SET (docs/citus.md)."""
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute(f"drop role if exists {ROLE}")
        su.execute(f"create role {ROLE} login")
        su.execute(f"grant harbor_app to {ROLE} with inherit true, set false")
    with psycopg.connect(cluster_db.admin_url) as admin:
        admin.execute("set local harbor.tenant_id = 'append-a'")
        admin.execute("select harbor.bind_role(%s, 'append-a', user_id => 'ann')", (ROLE,))
    # a turn of bob's, which the attacks below must leave alone
    with psycopg.connect(cluster_db.app_url, autocommit=True) as app:
        app.execute(query("append_turn_delegated"), _call(BOB, "bob: his own turn"))
    yield ROLE
    with psycopg.connect(cluster_db.admin_url) as admin:
        admin.execute("set local harbor.tenant_id = 'append-a'")
        admin.execute("select harbor.unbind_role(%s)", (ROLE,))
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as su:
        su.execute(f"drop role {ROLE}")


def test_a_bound_role_appends_its_own_turn(cluster_db: ClusterDatabase, bound_role: str) -> None:
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        row = conn.execute(query("append_turn_delegated"), _call(ANN, "ann: bound turn")).fetchone()
    assert row is not None and row[0] is not None
    assert ("ann", "s1", "ann: bound turn") in _turns(cluster_db.superuser_url, "append-a")


ATTACKS = {
    # the distribution argument names bob's tenant: the call goes to its worker
    "another tenant": {"tenant_id": "append-b", "user_id": "bob", "principal_id": "bob"},
    "another tenant, own user": {"tenant_id": "append-b"},
    "another user of its tenant": {"user_id": "bob", "principal_id": "bob"},
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", ["autocommit", "set local", "worker"])
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (the delegated call alone), in a transaction whose SET LOCALs name the same
    # owner (they reach the worker too), or on the named tenant's worker directly. The
    # worker checks the arguments against the binding before any row is read or locked:
    # refused, and bob's tenant keeps its one turn and its locks
    params = _call(ANN, "forged turn", **ATTACKS[attack])
    victim = str(params["tenant_id"])
    before = (_turns(cluster_db.superuser_url, victim), _locks(cluster_db.superuser_url, victim))
    if how == "worker":
        node = cluster_db.node_of(victim)
        index = [w.port for w in cluster_db.cluster.workers].index(node.port)
        url = cluster_db.worker_url(index, bound_role)
    else:
        url = cluster_db.url_for(bound_role)
    with psycopg.connect(url, autocommit=how == "autocommit") as conn:
        if how != "autocommit":
            forged = MemoryOwner(
                tenant_id=victim,
                principal_id=str(params["principal_id"]),
                user_id=str(params["user_id"]),
                session_id="s1",
            )
            for command in local_identity(forged):
                conn.execute(command)
        with pytest.raises(errors.InsufficientPrivilege, match="not the caller's"):
            conn.execute(query("append_turn_delegated"), params)
    after = (_turns(cluster_db.superuser_url, victim), _locks(cluster_db.superuser_url, victim))
    assert after == before
    assert ("ann", "s1", "forged turn") not in _turns(cluster_db.superuser_url, "append-b")


WRITERS = 6
PER_WRITER = 15


def test_concurrent_appends_keep_their_commit_order_on_the_cluster(
    cluster_db: ClusterDatabase,
) -> None:
    # tests/integration/test_turn_order.py's property on the cluster: within a session
    # the ids are in commit order, so a reader following id > cursor misses no turn
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s-order")

    async def run() -> tuple[list[int], set[int]]:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=4, max_size=4)
        await db.open()
        try:
            return await follow_concurrent_appends(
                PostgresShortTermStore(db), owner, WRITERS, PER_WRITER
            )
        finally:
            await db.close()

    seen, appended = asyncio.run(run())
    assert len(appended) == WRITERS * PER_WRITER
    assert sorted(seen) == seen
    assert set(seen) == appended


def test_an_append_after_a_move_to_a_lower_range_stays_above_the_sessions_turns(
    cluster_db: ClusterDatabase,
) -> None:
    # each node draws ids from its own range of the sequence; turns drawn on a node with a
    # higher range (the tenant's shards since moved) are planted here as the superuser:
    # the next append's id comes after the session's last turn, past an id another
    # session of the tenant holds
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s-moved")
    high = 7 << 48
    with psycopg.connect(cluster_db.superuser_url) as su:
        for tenant_session, planted in (("s-moved", high), ("s-other", high + 1)):
            su.execute(
                "insert into harbor.messages (tenant_id, id, user_id, session_id, principal_id,"
                " role, content) overriding system value"
                " values ('append-a', %s, 'ann', %s, 'ann', 'user', 'planted')",
                (planted, tenant_session),
            )
    with psycopg.connect(cluster_db.app_url, autocommit=True) as app:
        first = app.execute(query("append_turn_delegated"), _call(owner, "after")).fetchone()
        second = app.execute(query("append_turn_delegated"), _call(owner, "then")).fetchone()
    assert first is not None and second is not None
    assert first[0] == high + 2  # (high + 1 is s-other's)
    assert second[0] == high + 3


def test_concurrent_appends_after_a_move_to_a_lower_range_keep_their_commit_order(
    cluster_db: ClusterDatabase,
) -> None:
    # the same property where each append's id comes from the session's last turn, not
    # the node's sequence (a turn planted above the node's range, as after a move): the
    # appends that committed while one waited for the locks took the ids it would take,
    # so it stores its turn by the steps apart (sql/citus/append.sql), after them
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s-order-moved")
    with psycopg.connect(cluster_db.superuser_url) as su:
        su.execute(
            "insert into harbor.messages (tenant_id, id, user_id, session_id, principal_id,"
            " role, content) overriding system value"
            " values ('append-a', %s, 'ann', 's-order-moved', 'ann', 'user', 'planted')",
            (9 << 48,),
        )

    async def run() -> tuple[list[int], set[int]]:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=4, max_size=4)
        await db.open()
        try:
            return await follow_concurrent_appends(
                PostgresShortTermStore(db), owner, WRITERS, PER_WRITER
            )
        finally:
            await db.close()

    seen, appended = asyncio.run(run())
    assert len(appended) == WRITERS * PER_WRITER
    assert min(appended) > 9 << 48
    assert sorted(seen) == seen
    assert set(seen) == appended | {9 << 48}


# (session_state's row before the append, or None; turns before it; the answer)
DUE_CASES = {
    "first turn, below min_turns": (None, 0, False),
    "no summary yet, min_turns reached": (None, 1, True),
    "a summary's lease held": (("now() + interval '1 minute'", None, 0), 1, False),
    "summarised within the cooldown": ((None, "now() - interval '10 seconds'", 0), 1, False),
    "summarised long ago, enough new turns": ((None, "now() - interval '2 hours'", 0), 1, True),
    "summarised long ago, too few new turns": ((None, "now() - interval '2 hours'", 1), 1, False),
    "fewer turns than at the summary": ((None, "now() - interval '2 hours'", 5), 1, True),
}


@pytest.mark.parametrize("case", sorted(DUE_CASES))
def test_the_delegated_summary_check_answers_as_summary_due_rows(
    cluster_db: ClusterDatabase, case: str
) -> None:
    # harbor.append_turn writes summary_due_rows's rule out again: on each kind of
    # session it answers what that function answers right after the append (min_turns 2,
    # a cooldown of a minute), in the same transaction on the tenant's worker
    state, before, expected = DUE_CASES[case]
    session = "due-" + re.sub(r"\W+", "-", case)
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id=session)
    with psycopg.connect(cluster_db.app_url, autocommit=True) as app:
        for n in range(before):
            app.execute(query("append_turn_delegated"), _call(owner, f"before {n}"))
    if state is not None:
        lease, summarised, turns_at_summary = state
        with psycopg.connect(cluster_db.superuser_url) as su:
            su.execute(
                "insert into harbor.session_state (tenant_id, user_id, session_id,"
                f" summary_lease_until, summarised_at, turns_at_summary) values ('append-a',"
                f" 'ann', %s, {lease or 'null'}, {summarised or 'null'}, %s)",
                (session, turns_at_summary),
            )
    with psycopg.connect(cluster_db.app_url) as conn:
        for command in local_identity(owner):
            conn.execute(command)
        row = conn.execute(
            query("append_turn_delegated"),
            _call(owner, "the turn", min_turns=2, cooldown_seconds=60.0),
        ).fetchone()
        rule = conn.execute(
            "select due from harbor.summary_due_rows('append-a', 'ann', %s, 2, 60.0, 0)",
            (session,),
        ).fetchone()
    assert row is not None and rule is not None
    assert (row[2], rule[0]) == (expected, expected)


def test_the_synchronous_append_is_the_same_delegated_call(cluster_db: ClusterDatabase) -> None:
    # append_sync (HarborChatMessageHistory without an event loop) runs the same call in
    # its transaction (delegated there too): its turn follows the async append's, in order
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s-sync")

    async def run() -> list[int]:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        store = PostgresShortTermStore(db)
        try:
            first = await store.append(owner, ConversationMessage(role="user", content="async"))
            second = await asyncio.to_thread(
                store.append_sync, owner, ConversationMessage(role="assistant", content="sync")
            )
            recent = await store.recent(owner, 10)
        finally:
            await db.close()
        assert [m.content for m in recent] == ["async", "sync"]
        return [int(first.id or 0), int(second.id or 0)]

    first, second = asyncio.run(run())
    assert first >= 1 << 48  # drawn on a worker (its range of the sequence)
    assert second > first


def test_migrate_again_keeps_the_append_on_the_tenants_worker(
    cluster_db: ClusterDatabase,
) -> None:
    # `harbor-pg migrate` re-applies sql/citus/append.sql and registers the function again
    # (it first makes every harbor function a Citus object without a distribution
    # argument): afterwards the append is still one call, sent to the tenant's worker
    from harbor_pg.db import citus, migrate

    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
        conn.execute("update public.harbor_idempotent_sql set sha256 = 'stale'")
    migrate.upgrade(cluster_db.owner_url, progress=None)
    with psycopg.connect(cluster_db.superuser_url) as conn:
        found = conn.execute(
            "select distribution_argument_index, force_delegation from pg_dist_object"
            " where classid = 'pg_proc'::regclass and objid = %s::regprocedure",
            (citus.APPEND_FUNCTION,),
        ).fetchone()
    assert found == (0, True)
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s-migrated")

    async def run(manager: MemoryManager) -> None:
        await manager.append(owner, ConversationMessage(role="user", content="after migrate"))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert [p for p, _c in sent] == [cluster_db.node_of(owner.tenant_id).port], sent


def _plant_turns(url: str, tenant: str, user: str, session: str, turns: int) -> None:
    """``turns`` turns of ``user``'s ``session`` (written as the superuser)."""
    with psycopg.connect(url) as su:
        su.execute(
            "insert into harbor.messages (tenant_id, user_id, session_id, principal_id, role,"
            " content) select %s, %s, %s, %s, 'user', 'planted ' || g"
            " from generate_series(1, %s) g",
            (tenant, user, session, user, turns),
        )


def _worker_of(cluster_db: ClusterDatabase, tenant: str, user: str = "postgres") -> str:
    node = cluster_db.node_of(tenant)
    index = [w.port for w in cluster_db.cluster.workers].index(node.port)
    return cluster_db.worker_url(index, user)


SUMMARISED_TURNS = 3000


def _summarised_session(cluster_db: ClusterDatabase, session: str) -> MemoryOwner:
    """A session of ann's with SUMMARISED_TURNS turns, summarised two hours ago at all
    but ten of them."""
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id=session)
    _plant_turns(cluster_db.superuser_url, "append-a", "ann", session, SUMMARISED_TURNS)
    with psycopg.connect(cluster_db.superuser_url) as su:
        su.execute(
            "insert into harbor.session_state (tenant_id, user_id, session_id, summarised_at,"
            " turns_at_summary) values ('append-a', 'ann', %s, now() - interval '2 hours', %s)",
            (session, SUMMARISED_TURNS - 10),
        )
    return owner


def _calls_as_app(url: str, owner: MemoryOwner, statement: str, params: dict[str, Any]) -> Any:
    """``statement``'s row, run as harbor_app with ``owner``'s identity on the node of
    ``url`` (a superuser's), and the calls of harbor's PL/pgSQL functions it made there
    ({name: calls}, track_functions = 'pl')."""
    with psycopg.connect(url) as conn:
        # (SET, not SET LOCAL, which Citus sends on to the workers, where harbor_app may
        # not set track_functions; the connection ends here)
        conn.execute("set track_functions = 'pl'")
        conn.execute("set role harbor_app")
        for command in local_identity(owner):
            conn.execute(command)
        row = conn.execute(statement, params).fetchone()
        calls = dict(
            conn.execute(
                "select funcname::text, calls from pg_stat_xact_user_functions"
                " where schemaname = 'harbor'"
            ).fetchall()
        )
    return row, calls


def test_the_delegated_append_counts_a_summarised_session_once(
    cluster_db: ClusterDatabase,
) -> None:
    # on the tenant's worker a summarised session's turns are counted by
    # harbor._delegated_session_turns (the session tested once against the caller's
    # identity, as harbor._session_turns does on one server), not by a statement that
    # tests the shard's policy on every turn: called on the worker (where Citus runs the
    # delegated call), the append calls it once, and answers as the rule does (11 turns
    # since the summary with this one: due at min_turns 11; then 12: not at 13; through
    # the coordinator then 13: due at 13)
    owner = _summarised_session(cluster_db, "s-counted")
    worker = _worker_of(cluster_db, owner.tenant_id)
    for min_turns, expected in ((11, True), (13, False)):
        row, calls = _calls_as_app(
            worker,
            owner,
            query("append_turn_delegated"),
            _call(owner, f"min {min_turns}", min_turns=min_turns, cooldown_seconds=60.0),
        )
        assert row is not None and row[2] is expected
        assert calls.get("append_turn") == 1, calls
        assert calls.get("_delegated_session_turns") == 1, calls
    with psycopg.connect(cluster_db.app_url, autocommit=True) as app:
        row = app.execute(
            query("append_turn_delegated"),
            _call(owner, "delegated", min_turns=13, cooldown_seconds=60.0),
        ).fetchone()
    assert row is not None and row[2] is True


def test_an_append_run_on_the_coordinator_counts_under_the_policies(
    cluster_db: ClusterDatabase,
) -> None:
    # a call Citus does not delegate (here: inside a CTE) runs on the coordinator, where
    # harbor._delegated_session_turns's statement would go to the worker on a connection
    # opened as harbor_search (NOLOGIN): there the append counts the turns under the
    # policies, and answers the same
    owner = _summarised_session(cluster_db, "s-not-delegated")
    statement = f"with c as materialized ({query('append_turn_delegated')}) select * from c"
    for min_turns, expected in ((11, True), (13, False)):
        row, calls = _calls_as_app(
            cluster_db.superuser_url,
            owner,
            statement,
            _call(owner, f"min {min_turns}", min_turns=min_turns, cooldown_seconds=60.0),
        )
        assert row is not None and row[2] is expected
        assert calls.get("append_turn") == 1, calls
        assert "_delegated_session_turns" not in calls, calls


def test_the_delegated_count_is_of_the_callers_own_session_only(
    cluster_db: ClusterDatabase, bound_role: str
) -> None:
    # harbor._delegated_session_turns reads without the policies: on the worker of the
    # tenant named, the bound role (ann of append-a) and harbor_app with ann's identity get
    # ann's session's count, and 0 for another session of ann's, a session of another user
    # of the tenant and one of another tenant; on the coordinator the call fails
    sessions = {
        ("append-a", "ann", "s-count"): 4,
        ("append-a", "ann", "s-count-other"): 2,
        ("append-a", "bob", "s-count"): 3,
        ("append-b", "bob", "s-count"): 3,
        ("append-b", "ann", "s-count"): 1,
    }
    for (tenant, user, session), turns in sessions.items():
        _plant_turns(cluster_db.superuser_url, tenant, user, session, turns)
    counted = "select harbor._delegated_session_turns(%s, %s, %s)"
    ann = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s-count")
    for (tenant, user, session), turns in sessions.items():
        expected = turns if (tenant, user, session) == ("append-a", "ann", "s-count") else 0
        for login in (bound_role, "harbor_app"):
            with psycopg.connect(_worker_of(cluster_db, tenant, login)) as conn:
                for command in local_identity(ann):
                    conn.execute(command)
                row = conn.execute(counted, (tenant, user, session)).fetchone()
            assert row is not None and row[0] == expected, (tenant, user, session, login)
    with psycopg.connect(cluster_db.url_for(bound_role)) as conn:
        for command in local_identity(ann):
            conn.execute(command)
        with pytest.raises(errors.ConnectionFailure, match="harbor_search"):
            conn.execute(counted, ("append-a", "ann", "s-count"))


def _shard_tables(cluster_db: ClusterDatabase, tenant: str) -> dict[str, str]:
    """The names of ``tenant``'s shards of the append's three tables."""
    with psycopg.connect(cluster_db.superuser_url) as conn:
        return {
            table: str(
                conn.execute(
                    "select shard_name(%s::regclass,"
                    " get_shard_id_for_distribution_column(%s::regclass, %s::text))",
                    (table, table, tenant),
                ).fetchone()[0]  # type: ignore[index]
            )
            for table in ("harbor.messages", "harbor.owner_locks", "harbor.session_state")
        }


def _prepared(conn: psycopg.Connection[Any]) -> dict[str, str]:
    return {
        str(name): str(text)
        for name, text in conn.execute(
            "select name, statement from pg_prepared_statements where name like 'harbor_append_%'"
        ).fetchall()
    }


def test_on_the_worker_the_append_runs_on_the_shard_tables_prepared_once(
    cluster_db: ClusterDatabase,
) -> None:
    # on the tenant's worker the append's statements address the tenant's own shards
    # (harbor._append_steps), prepared in the connection on its first append and used
    # again by the next ones: after two appends there are seven (the append as one
    # statement, and its steps apart), each naming a shard of the tenant, and the turns
    # are stored with the session's ids in order; the first turn of a user and session
    # writes their lock rows
    owner = MemoryOwner(tenant_id="append-a", principal_id="pia", session_id="s-prepared")
    locks_before = _locks(cluster_db.superuser_url, owner.tenant_id)
    shards = _shard_tables(cluster_db, owner.tenant_id)
    with psycopg.connect(_worker_of(cluster_db, owner.tenant_id, "harbor_app")) as conn:
        conn.autocommit = True
        assert _prepared(conn) == {}
        ids = []
        for n in range(2):
            row = conn.execute(
                query("append_turn_delegated"),
                _call(owner, f"prepared {n}", min_turns=5, cooldown_seconds=60.0),
            ).fetchone()
            assert row is not None and row[2] is False
            ids.append(int(row[0]))
            if n == 0:
                first = _prepared(conn)
        prepared = _prepared(conn)
    assert prepared == first
    assert len(prepared) == 7, prepared
    assert any(name.startswith("harbor_append_one_") for name in prepared), prepared
    suffix = shards["harbor.messages"].rsplit("_", 1)[1]
    assert all(name.endswith("_" + suffix) for name in prepared), prepared
    for text in prepared.values():
        assert any(f" {shard} " in text for shard in shards.values()), text
    assert ids == sorted(ids)
    turns = _turns(cluster_db.superuser_url, "append-a")
    assert ("pia", "s-prepared", "prepared 0") in turns
    assert ("pia", "s-prepared", "prepared 1") in turns
    # the user's lock row and the session's, once
    assert _locks(cluster_db.superuser_url, owner.tenant_id) == locks_before + 2
    locks = next(text for name, text in prepared.items() if "_locks_" in name)
    assert f" {shards['harbor.owner_locks']} " in locks, locks


def test_a_prepared_statement_of_the_appends_name_is_not_run(
    cluster_db: ClusterDatabase,
) -> None:
    # a statement prepared in the connection under the name of one of the append's, with
    # another text, is replaced before the append runs: here one that would hand the
    # append a session's last id of 10**15 (its turn would get the next)
    owner = MemoryOwner(tenant_id="append-a", principal_id="ann", session_id="s-planted")
    suffix = _shard_tables(cluster_db, owner.tenant_id)["harbor.messages"].rsplit("_", 1)[1]
    with psycopg.connect(_worker_of(cluster_db, owner.tenant_id, "harbor_app")) as conn:
        conn.autocommit = True
        conn.execute(
            f"prepare harbor_append_last_{suffix}(text, text, text) as"
            " select 1000000000000000::bigint"
        )
        row = conn.execute(query("append_turn_delegated"), _call(owner, "planted")).fetchone()
        prepared = _prepared(conn)
    assert row is not None and int(row[0]) < 10**15
    assert "1000000000000000" not in prepared[f"harbor_append_last_{suffix}"]
    assert ("ann", "s-planted", "planted") in _turns(cluster_db.superuser_url, "append-a")
