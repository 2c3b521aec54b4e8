"""On the cluster: the identity reaches the workers, a worker enforces the policies
for a direct harbor_app login, and a tenant's writes run on its worker alone."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg import errors

from harbor_pg.db.connection import Database, local_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.tiers.short_term import _append_params
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import GLOBAL_FLAG_SET, CommandRecorder, LoggedDatabase

OWNER = MemoryOwner(tenant_id="route-a", principal_id="ann", session_id="s1")
OTHER = MemoryOwner(tenant_id="route-b", principal_id="bob", session_id="s1")


def _identity(conn: psycopg.Connection[Any], owner: MemoryOwner) -> None:
    for command in local_identity(owner):
        conn.execute(command)


def _save(url: str, owner: MemoryOwner, content: str) -> None:
    with psycopg.connect(url) as conn:
        _identity(conn, owner)
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) values (%s, 'user', %s, %s, %s, md5(%s) || md5(%s))",
            (owner.tenant_id, owner.user_id, owner.principal_id, content, content, content),
        )


def _visible(url: str, owner: MemoryOwner | None, *, set_config: bool = False) -> list[str]:
    with psycopg.connect(url) as conn:
        if owner is not None and set_config:
            conn.execute(
                query("set_identity"),
                {
                    "tenant_id": owner.tenant_id,
                    "project_id": None,
                    "principal_id": owner.principal_id,
                    "user_id": None,
                    "session_id": owner.session_id,
                    "run_id": None,
                },
            )
        elif owner is not None:
            _identity(conn, owner)
        rows = conn.execute(
            "select content from harbor.memories where tenant_id <> '' order by content"
        ).fetchall()
    return [r[0] for r in rows]


@pytest.fixture(scope="module")
def routed(cluster_db: ClusterDatabase) -> ClusterDatabase:
    _save(cluster_db.app_url, OWNER, "ann: routed fact")
    _save(cluster_db.app_url, OTHER, "bob: routed fact")
    return cluster_db


def test_set_local_identity_reaches_the_workers(routed: ClusterDatabase) -> None:
    assert _visible(routed.app_url, OWNER) == ["ann: routed fact"]
    assert _visible(routed.app_url, OTHER) == ["bob: routed fact"]


def test_set_config_identity_does_not_reach_them_and_fails_closed(routed: ClusterDatabase) -> None:
    # the single server's way: the workers' policies see no identity, so nothing
    assert _visible(routed.app_url, OWNER, set_config=True) == []
    assert _visible(routed.app_url, None) == []


@pytest.mark.parametrize("node", ["coordinator", "worker1", "worker2"])
def test_a_bound_role_keeps_its_binding_whatever_set_local_says(
    routed: ClusterDatabase, node: str
) -> None:
    # the binding is read on every node (from the node's own placement of the
    # reference table): a role bound to route-a that sets another tenant with SET
    # LOCAL (which does reach the workers) still reads route-a's rows, and its own
    # bound user's only. (Before, the binding read the coordinator's empty shell
    # table, and SET LOCAL gave a bound role any tenant.)
    role = "harbor_test_routed_bound"
    with psycopg.connect(routed.superuser_url, autocommit=True) as su:
        su.execute(f"drop role if exists {role}")
        su.execute(f"create role {role} login")
        # (on Citus a bound role is granted harbor_app without SET: docs/citus.md)
        su.execute(f"grant harbor_app to {role} with inherit true, set false")
    with psycopg.connect(routed.admin_url) as admin:
        admin.execute("set local harbor.tenant_id = 'route-a'")
        admin.execute("select harbor.bind_role(%s, 'route-a', user_id => 'ann')", (role,))
    try:
        index = {"coordinator": None, "worker1": 0, "worker2": 1}[node]
        url = routed.url_for(role) if index is None else routed.worker_url(index, role)
        with psycopg.connect(url) as conn:
            assert conn.execute(
                "select harbor.caller_tenant(), harbor.caller_user()"
            ).fetchone() == (
                "route-a",
                "ann",
            )
            conn.execute("set local harbor.tenant_id = 'route-b'")
            conn.execute("set local harbor.user_id = 'bob'")
            rows = conn.execute(
                "select content from harbor.memories where tenant_id <> '' order by content"
            ).fetchall()
        assert [r[0] for r in rows] == ["ann: routed fact"]
    finally:
        with psycopg.connect(routed.admin_url) as admin:
            admin.execute("set local harbor.tenant_id = 'route-a'")
            admin.execute("select harbor.unbind_role(%s)", (role,))
        with psycopg.connect(routed.superuser_url, autocommit=True) as su:
            su.execute(f"drop role {role}")


@pytest.mark.parametrize("which", [0, 1])
def test_a_direct_worker_login_sees_only_its_identity(routed: ClusterDatabase, which: int) -> None:
    url = routed.worker_url(which, "harbor_app")
    assert _visible(url, OWNER) == ["ann: routed fact"]
    assert _visible(url, None) == []
    with psycopg.connect(url) as conn:
        _identity(conn, OWNER)
        # the shard tables themselves are behind the same policies
        shards = conn.execute(
            "select c.oid::regclass::text from pg_class c"
            " where c.relname ~ '^memories_[0-9]+$' and c.relnamespace = 'harbor'::regnamespace"
        ).fetchall()
        for (shard,) in shards:
            leaked = conn.execute(f"select content from {shard} where content like 'bob:%'")
            assert leaked.fetchall() == []


@pytest.mark.parametrize("which", [0, 1])
def test_a_direct_worker_login_cannot_forge_another_tenants_row(
    routed: ClusterDatabase, which: int
) -> None:
    with psycopg.connect(routed.worker_url(which, "harbor_app")) as conn:
        _identity(conn, OWNER)
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(
                "insert into harbor.memories (tenant_id, scope, user_id, content, content_hash)"
                " values ('route-b', 'user', 'bob', 'forged', repeat('f', 64))"
            )


def _plan(url: str, owner: MemoryOwner, statement: str, params: dict[str, Any]) -> str:
    with psycopg.connect(url) as conn:
        _identity(conn, owner)
        # values bound client-side: the plan Citus makes for the values a call sends
        # (a server-side EXPLAIN of $n parameters cannot type them)
        cur = psycopg.ClientCursor(conn)
        rows = cur.execute("explain (costs off) " + statement, params).fetchall()
        conn.rollback()
    return "\n".join(r[0] for r in rows)


def _single_task_on(plan: str, port: int) -> None:
    assert re.search(r"Task Count: 1\b", plan), plan
    assert re.findall(r"Node: host=\S+ port=(\d+)", plan) == [str(port)], plan


def _remote_commands(
    url: str, owner: MemoryOwner, statement: str, params: dict[str, Any]
) -> list[tuple[int, str]]:
    """(port, command) of each command Citus sends to a node while running
    ``statement`` (``citus.log_remote_commands``), rolled back afterwards."""
    sent: list[tuple[int, str]] = []
    with psycopg.connect(url) as conn:

        def seen(diag: psycopg.errors.Diagnostic) -> None:
            found = re.search(r"on server \S+@\S+:(\d+)", diag.message_detail or "")
            text = diag.message_primary or ""
            if found and text.startswith("issuing "):
                sent.append((int(found.group(1)), text.removeprefix("issuing ")))

        conn.add_notice_handler(seen)
        _identity(conn, owner)
        conn.execute("set local citus.log_remote_commands = on")
        conn.execute(statement, params)
        conn.rollback()
    return sent


def _nodes_written(
    url: str, owner: MemoryOwner, statement: str, params: dict[str, Any]
) -> set[int]:
    """The ports of the nodes Citus sends commands to while running ``statement``."""
    return {port for port, _command in _remote_commands(url, owner, statement, params)}


def _queries(commands: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """The commands that are statements (not the transaction or the SET LOCALs)."""
    control = re.compile(r"^(BEGIN|COMMIT|ROLLBACK|SET |SELECT assign_distributed|PREPARE)", re.I)
    return [(p, c) for p, c in commands if not control.match(c)]


def _legs_and_hydration(
    commands: list[tuple[int, str]],
) -> tuple[set[int], set[int]]:
    """The nodes reached by recall's candidate-leg statements, and by its hydration
    (the statement that joins the ranked ids, an intermediate result Citus first
    copies to the workers: ``COPY ... (format result)``)."""

    def hydrating(command: str) -> bool:
        return "read_intermediate_result" in command or (
            command.startswith("COPY ") and "format result" in command
        )

    legs = {p for p, c in _queries(commands) if not hydrating(c)}
    hydration = {p for p, c in _queries(commands) if hydrating(c)}
    return legs, hydration


def test_recall_runs_on_the_tenants_worker_alone(routed: ClusterDatabase) -> None:
    # every statement of recall (Citus's remote-command log) goes to the tenant's
    # worker: the candidate legs', and the hydration's, one router query that reads the
    # ranked ids' rows from the tenant's shard (no intermediate result copied to the
    # workers), and the answer is right
    statement = "select content from harbor.recall('routed fact')"
    port = routed.node_of(OWNER.tenant_id).port
    commands = _remote_commands(routed.app_url, OWNER, statement, {})
    legs, hydration = _legs_and_hydration(commands)
    assert legs == {port}
    assert hydration == set()  # (no intermediate result: the hydration is routed)
    # (the hydration's read: the rows in jsonb, without their fts column)
    hydrations = [(p, c) for p, c in _queries(commands) if "'fts'" in c]
    assert len(hydrations) == 1 and hydrations[0][0] == port, hydrations
    assert {p for p, _c in _queries(commands)} == {port}
    assert _visible_recall(routed.app_url, OWNER, statement) == ["ann: routed fact"]


def test_recall_with_importance_decay_runs_on_the_tenants_worker_alone(
    routed: ClusterDatabase,
) -> None:
    # the decay reads the candidates' hits (harbor.memory_hits) in the routed statement;
    # the hits are counted afterwards by harbor.record_hits(), on the tenant's worker and
    # the GLOBAL shard's (a GLOBAL memory the caller recalled is counted too)
    statement = "select content from harbor.recall('routed fact', importance_half_life_hours => 24)"
    port = routed.node_of(OWNER.tenant_id).port
    commands = _remote_commands(routed.app_url, OWNER, statement, {})
    legs, hydration = _legs_and_hydration(commands)
    assert legs == {port} and hydration == set()
    assert {p for p, _c in _queries(commands)} == {port}
    assert _visible_recall(routed.app_url, OWNER, statement) == ["ann: routed fact"]
    counted = _remote_commands(
        routed.app_url,
        OWNER,
        "select harbor.record_hits(array(select id from harbor.recall('routed fact')))",
        {},
    )
    assert {p for p, _c in _queries(counted)} <= {port, routed.node_of("").port}
    with psycopg.connect(routed.app_url) as conn:
        _identity(conn, OWNER)
        assert conn.execute(
            "select harbor.record_hits(array(select id from harbor.recall('routed fact')))"
        ).fetchone() == (1,)


def test_recall_with_the_global_scope_adds_only_the_global_shard(
    routed: ClusterDatabase,
) -> None:
    with psycopg.connect(routed.superuser_url) as conn:
        conn.execute(GLOBAL_FLAG_SET)
        conn.execute(
            "insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,"
            " content_hash) values ('', 'global', '', 'admin', 'global: routed fact',"
            " repeat('9', 64)) on conflict do nothing"
        )
    statement = "select content from harbor.recall('routed fact', scopes => '{global,user}')"
    ports = {routed.node_of(OWNER.tenant_id).port, routed.node_of("").port}
    legs, _hydration = _legs_and_hydration(_remote_commands(routed.app_url, OWNER, statement, {}))
    assert legs == ports
    # the tenant's memory and the GLOBAL one, each once (bob's stays out)
    found = _visible_recall(routed.app_url, OWNER, statement)
    assert sorted(found) == ["ann: routed fact", "global: routed fact"]


def test_snapshot_runs_on_the_tenants_worker_alone(routed: ClusterDatabase) -> None:
    # on Citus a snapshot is its three reads (harbor_pg.manager.snapshot): recent
    # turns, working state and recall; each reaches the tenant's worker alone (recall:
    # its candidate legs, as above)
    from harbor_pg.tiers.short_term import _recent_query
    from harbor_pg.tiers.working import run_key

    port = routed.node_of(OWNER.tenant_id).port
    run_owner = MemoryOwner(tenant_id="route-a", principal_id="ann", session_id="s1", run_id="r1")
    name, params = _recent_query(OWNER, 20, 3600.0)
    statements = [
        (query(name), params),
        (query("scratch"), run_key(run_owner)),
    ]
    for statement, values in statements:
        assert _nodes_written(routed.app_url, OWNER, statement, values) == {port}, statement
    recall = "select content from harbor.recall('routed fact')"
    legs, _hydration = _legs_and_hydration(_remote_commands(routed.app_url, OWNER, recall, {}))
    assert legs == {port}
    _single_task_on(_plan(routed.app_url, OWNER, query("scratch"), run_key(run_owner)), port)


def _visible_recall(url: str, owner: MemoryOwner, statement: str) -> list[str]:
    with psycopg.connect(url) as conn:
        _identity(conn, owner)
        return [r[0] for r in conn.execute(statement).fetchall()]


def test_append_runs_on_the_tenants_worker_alone(routed: ClusterDatabase) -> None:
    params = _append_params(OWNER, ConversationMessage(role="user", content="hello"))
    plan = _plan(routed.app_url, OWNER, query("append_message"), params)
    # the session lock is taken on the coordinator (the SELECT reads no table), then
    # the row goes to its shard: the write reaches the tenant's worker and no other
    assert "INSERT/SELECT method: pull to coordinator" in plan, plan
    port = routed.node_of(OWNER.tenant_id).port
    assert _nodes_written(routed.app_url, OWNER, query("append_message"), params) == {port}


def test_save_runs_on_the_tenants_worker_alone(routed: ClusterDatabase) -> None:
    params = {
        "tenant_id": OWNER.tenant_id,
        "id": None,
        "scope": "user",
        "project_id": "",
        "user_id": OWNER.user_id,
        "session_id": "",
        "run_id": "",
        "principal_id": OWNER.principal_id,
        "memory_type": "fact",
        "importance": 0.5,
        "content": "a fact",
        "content_hash": "a" * 64,
        "context": None,
        "entity_ids": [],
        "source": "user",
        "sensitivity": "none",
        "source_session_id": None,
        "source_message_ids": [],
        "metadata": "{}",
        "valid_from": None,
        "expires_at": None,
    }
    plan = _plan(routed.app_url, OWNER, query("insert_memory"), params)
    _single_task_on(plan, routed.node_of(OWNER.tenant_id).port)


def test_reading_a_tenants_turns_runs_on_its_worker_alone(routed: ClusterDatabase) -> None:
    statement = (
        "select * from harbor.messages m where m.tenant_id = %(t)s and m.user_id = %(u)s"
        " and m.session_id = %(s)s order by m.id desc limit 20"
    )
    params = {"t": OWNER.tenant_id, "u": OWNER.user_id, "s": OWNER.session_id}
    _single_task_on(
        _plan(routed.app_url, OWNER, statement, params), routed.node_of(OWNER.tenant_id).port
    )


def test_closing_a_memory_runs_on_the_tenants_worker_alone(routed: ClusterDatabase) -> None:
    statement = (
        "update harbor.memories set valid = tstzrange(lower(valid), now(), '[)')"
        " where tenant_id = %(t)s and id = %(id)s"
    )
    plan = _plan(routed.app_url, OWNER, statement, {"t": OWNER.tenant_id, "id": "x"})
    _single_task_on(plan, routed.node_of(OWNER.tenant_id).port)


def test_an_access_token_resolves_on_the_cluster_and_only_for_its_holder(
    routed: ClusterDatabase,
) -> None:
    # harbor.access_tokens is a reference table: the holder's lookup (hash named with
    # set_config, which Citus does not forward) is answered on the coordinator
    token_hash = "7" * 64
    with psycopg.connect(routed.admin_url) as conn:
        _identity(conn, OWNER)
        conn.execute(
            query("token_insert"),
            {
                "tenant_id": OWNER.tenant_id,
                "token_hash": token_hash,
                "name": "cluster",
                "project_id": None,
                "principal_id": OWNER.principal_id,
                "user_id": None,
                "session_id": None,
                "run_id": None,
                "is_admin": False,
                "expires_at": None,
            },
        )
        conn.commit()

    def lookup(named: str) -> list[str]:
        with psycopg.connect(routed.app_url) as conn:
            conn.execute(query("token_holder"), {"token_hash": named})
            rows = conn.execute(query("token_identity"), {"token_hash": token_hash}).fetchall()
            conn.rollback()
        return [r[2] for r in rows]

    assert lookup(token_hash) == [OWNER.tenant_id]
    assert lookup("8" * 64) == []  # a caller without the token sees no row


async def _facade_commands(
    cluster_db: ClusterDatabase,
    call: Callable[[MemoryManager], Awaitable[Any]],
    **manager_args: Any,
) -> list[tuple[int, str]]:
    """(port, command) of each command Citus sends to a node while the facade (made with
    ``manager_args``) runs ``call``, as the application role or the elevated role (its
    pools hold one connection each, which log them)."""
    recorder = CommandRecorder()
    db = LoggedDatabase(cluster_db, recorder)
    await db.open()
    manager = MemoryManager.from_database(db, **manager_args)
    try:
        with recorder:
            await call(manager)
    finally:
        await manager.close()
        await db.close()
    return recorder.sent


def test_the_facades_save_and_save_many_are_one_call_each_on_the_tenants_worker(
    routed: ClusterDatabase,
) -> None:
    # a save of one memory is one call that Citus delegates to the tenant's worker
    # (harbor.save_memory_delegated, sql/citus/save.sql): one command, to that worker,
    # with no BEGIN, SET LOCAL or COMMIT; and so is a batch
    # (harbor.save_memories_delegated), committed there in one phase (a statement with a
    # writing CTE was planned in steps that reached both workers and committed in two
    # phases). (The append, one delegated call too: tests/citus/test_cluster_append.py.)
    owner = MemoryOwner(tenant_id="route-a", principal_id="ann", session_id="s-facade")

    async def run(manager: MemoryManager) -> None:
        await manager.append(owner, ConversationMessage(role="user", content="hello there"))
        await manager.save(owner, Memory(content="ann: a saved fact save"))

    # the append first, then only the save's commands
    asyncio.run(_facade_commands(routed, run))

    async def run_save(manager: MemoryManager) -> None:
        await manager.save(owner, Memory(content="ann: another saved fact"))

    sent = asyncio.run(_facade_commands(routed, run_save))
    port = routed.node_of(owner.tenant_id).port
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == port
    assert re.match(r"SELECT .* FROM harbor\.save_memory_delegated\('route-a'::text", command)

    async def run_batch(manager: MemoryManager) -> None:
        await manager.save_many(
            owner, [Memory(content="ann: a batch fact"), Memory(content="ann: a second one")]
        )

    sent = asyncio.run(_facade_commands(routed, run_batch))
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == port
    assert re.match(r"SELECT .* FROM harbor\.save_memories_delegated\('route-a'::text", command)


def test_the_facades_append_waits_for_an_erasure_of_its_user(routed: ClusterDatabase) -> None:
    # an erasure of a user takes the user's row of harbor.owner_locks first (harbor.erase);
    # on the cluster the append takes it too, before its session's (sql/citus/append.sql):
    # while another transaction holds it, an append in a new session waits
    owner = MemoryOwner(tenant_id="route-a", principal_id="ann", session_id="s-new-during")
    blocker = psycopg.connect(routed.app_url)
    try:
        _identity(blocker, owner)
        # the user's lock, as an erasure of the user takes it (harbor.erase)
        blocker.execute(
            "insert into harbor.owner_locks as l (tenant_id, user_id, session_id, scope)"
            " values (%(tenant_id)s, %(user_id)s, '', 'user')"
            " on conflict (tenant_id, user_id, session_id, scope, project_id, run_id)"
            " do update set scope = excluded.scope where false",
            {"tenant_id": owner.tenant_id, "user_id": owner.user_id},
        )

        async def append_while_held() -> tuple[bool, int | None]:
            db = Database(routed.app_url, routed.admin_url, min_size=1, max_size=1)
            await db.open()
            manager = MemoryManager.from_database(db)
            try:
                task = asyncio.create_task(
                    manager.append(owner, ConversationMessage(role="user", content="in flight"))
                )
                await asyncio.sleep(1.0)
                waited = not task.done()
                await asyncio.to_thread(blocker.commit)
                stored = await asyncio.wait_for(task, timeout=30)
                return waited, stored.id
            finally:
                await manager.close()
                await db.close()

        waited, stored_id = asyncio.run(append_while_held())
    finally:
        blocker.close()
    assert waited  # the append waited for the user's lock
    assert stored_id is not None  # and went on once it was released
