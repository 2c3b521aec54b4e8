"""On the cluster, the facade's history of a memory (its supersession chain) answers as on
one server: Citus plans memory_history's recursive CTEs only with one value of the
distribution column, so the chain is read for the caller's tenant, then for the global
memories (a chain never leaves its tenant). The tenant's chain is one call that Citus
delegates to the tenant's worker (harbor.memory_history_delegated, sql/citus/history.sql),
checked there against the caller's binding; the global chain one routed statement. A get
reads the same way, one shard at a time."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import Database, carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import GLOBAL_FLAG_SET, HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

ANN = MemoryOwner(tenant_id="history-a", principal_id="ann", session_id="s1")
BOB = MemoryOwner(tenant_id="history-b", principal_id="bob", session_id="s1")


def _chain(conn: psycopg.Connection, tenant: str, scope: str, user: str, texts: list[str]) -> None:
    """Memories ``texts`` of one owner key, each superseded by the next (the last current)."""
    ids = [f"{tenant or 'global'}-{i}" for i in range(len(texts))]
    # (the newest first: a memory's superseded_by names a stored one)
    for i, text in reversed(list(enumerate(texts))):
        current = i == len(texts) - 1
        conn.execute(
            "insert into harbor.memories (tenant_id, id, scope, user_id, principal_id, content,"
            " content_hash, valid, superseded_by) values (%s, %s, %s, %s, %s, %s,"
            " md5(%s) || md5(%s), tstzrange(now() - make_interval(days => %s),"
            " case when %s then null else now() - make_interval(days => %s) end, '[)'), %s)",
            (
                tenant,
                ids[i],
                scope,
                user,
                user or "admin",
                text,
                text,
                text,
                10 - i,
                current,
                9 - i,
                None if current else ids[i + 1],
            ),
        )


@pytest.fixture(scope="module")
def stored(cluster_db: ClusterDatabase) -> ClusterDatabase:
    with psycopg.connect(cluster_db.superuser_url) as conn:
        _chain(conn, "history-a", "user", "ann", ["ann: first", "ann: second", "ann: third"])
        _chain(conn, "history-b", "user", "bob", ["bob: first", "bob: second"])
        conn.execute(GLOBAL_FLAG_SET)
        _chain(conn, "", "global", "", ["global: first", "global: second"])
    return cluster_db


def _history(db: ClusterDatabase, owner: MemoryOwner, memory_id: str) -> list[str]:
    async def run() -> list[str]:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        try:
            return [m.content for m in await manager.history(owner, memory_id)]
        finally:
            await manager.close()
            await database.close()

    return asyncio.run(run())


@pytest.mark.parametrize("memory_id", ["history-a-0", "history-a-1", "history-a-2"])
def test_a_memorys_history_is_its_chain_from_any_link(
    stored: ClusterDatabase, memory_id: str
) -> None:
    assert _history(stored, ANN, memory_id) == ["ann: first", "ann: second", "ann: third"]


def test_a_global_memorys_history_is_read_from_the_global_shard(stored: ClusterDatabase) -> None:
    assert _history(stored, ANN, "global-1") == ["global: first", "global: second"]


def test_another_tenants_memory_has_no_history_for_the_caller(stored: ClusterDatabase) -> None:
    assert _history(stored, ANN, "history-b-1") == []


def _get(db: ClusterDatabase, owner: MemoryOwner, memory_id: str) -> tuple[Any, list[int]]:
    """The facade's get of ``memory_id``, and the nodes its statements reached, in order."""
    found: list[Any] = []

    async def run(manager: MemoryManager) -> None:
        found.append(await manager.get(owner, memory_id))

    sent = asyncio.run(_facade_commands(db, run))
    return found[0], [port for port, _command in _queries(sent)]


def test_a_get_reads_the_callers_shard_then_the_global_one(stored: ClusterDatabase) -> None:
    tenant, shared = stored.node_of("history-a").port, stored.node_of("").port
    own, reached = _get(stored, ANN, "history-a-2")
    assert own is not None and own.content == "ann: third"
    assert reached == [tenant]
    global_memory, reached = _get(stored, ANN, "global-1")
    assert global_memory is not None and global_memory.content == "global: second"
    assert reached == [tenant, shared]
    missing, reached = _get(stored, ANN, "history-b-1")  # another tenant's: not found
    assert missing is None and reached == [tenant, shared]


def test_the_facades_history_is_one_call_on_the_tenants_worker(stored: ClusterDatabase) -> None:
    found: list[Any] = []

    async def run(manager: MemoryManager) -> None:
        found.extend(await manager.history(ANN, "history-a-1"))

    sent = asyncio.run(_facade_commands(stored, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == stored.node_of(ANN.tenant_id).port
    assert re.match(r"SELECT .* FROM harbor\.memory_history_delegated\('history-a'::", command)
    assert [m.content for m in found] == ["ann: first", "ann: second", "ann: third"]


@pytest.mark.parametrize("memory_id", ["history-a-0", "history-a-2", "history-b-1", "global-1"])
def test_the_delegated_call_answers_as_the_coordinators_statement_and_one_servers(
    stored: ClusterDatabase, memory_id: str
) -> None:
    # from the delegated call in autocommit (twice: the second runs what the first
    # prepared), from the same function in a transaction (the coordinator's statement), and
    # memory_history for the caller's tenant under the same identity (one server's reads
    # '' too: the global chain, which the facade reads apart)
    params = {**carried_identity(ANN), "id": memory_id}
    with psycopg.connect(stored.app_url, autocommit=True) as conn:
        delegated = conn.execute(query("memory_history_delegated"), params).fetchall()
        again = conn.execute(query("memory_history_delegated"), params).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        coordinated = conn.execute(query("memory_history_delegated"), params).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        for setting, value in carried_identity(ANN).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        one_server = conn.execute(
            query("memory_history"), {"tenants": ["history-a"], "id": memory_id}
        ).fetchall()
    assert delegated == again == coordinated == one_server
    assert len(delegated) == (3 if memory_id.startswith("history-a") else 0)


ROLE = "harbor_test_history_bound"
ATTACKS = attacks("history-b")


@pytest.fixture(scope="module")
def bound_role(stored: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant history-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(stored, ROLE, "history-a", "ann") as role:
        yield role


def test_a_bound_role_reads_its_own_history(stored: ClusterDatabase, bound_role: str) -> None:
    with psycopg.connect(stored.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(
            query("memory_history_delegated"), {**carried_identity(ANN), "id": "history-a-1"}
        ).fetchall()
    assert [r[9] for r in rows] == ["ann: first", "ann: second", "ann: third"]


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    stored: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read, whatever the way
    params = {**carried_identity(ANN), "id": "history-b-1", **ATTACKS[attack]}
    assert_refused(stored, bound_role, query("memory_history_delegated"), params, how)
