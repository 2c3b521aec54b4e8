"""On the cluster, the facade reads memories by id in one call that Citus delegates to the
tenant's worker (harbor.get_memories_delegated, sql/citus/get.sql): one command to one
node, with no BEGIN, SET LOCAL or COMMIT, answering as the coordinator's statement and one
server's get_memories do; the global memories are read by one routed statement, only when
the call's answer ends with the marker that they may exist (a row, every column null: with
GLOBAL memories stored, as here; with none, the call alone:
tests/citus/test_cluster_global_flag.py), and for a get only when the tenant's shard has
none of the id. The identity the call carries as arguments is
checked on the worker against the caller's binding, so a bound role that names another
tenant or user is refused before anything is read."""

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
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory
from harbor_pg.tiers.long_term import PostgresLongTermStore
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import GLOBAL_FLAG_SET, HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

ANN = MemoryOwner(tenant_id="get-a", principal_id="ann", session_id="s1")
CARL = MemoryOwner(tenant_id="get-a", principal_id="carl", session_id="s1")
BOB = MemoryOwner(tenant_id="get-b", principal_id="bob", session_id="s1")
GLOBAL_ID = "get-global-1"
ROLE = "harbor_test_get_bound"


@pytest.fixture(scope="module")
def stored(cluster_db: ClusterDatabase) -> dict[str, str]:
    """Each owner's memories saved through the facade as the application role (the ids by
    name), and one global memory (the superuser's: an application role cannot write one)."""
    ids: dict[str, str] = {}

    async def write() -> None:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        manager = MemoryManager.from_database(db)
        try:
            for name, owner, memory in (
                ("ann", ANN, Memory(content="ann: the delegated get")),
                ("ann session", ANN, Memory(content="ann: s1's", scope=MemoryScope.SESSION)),
                ("carl", CARL, Memory(content="carl: his own")),
                ("bob", BOB, Memory(content="bob: another tenant's")),
            ):
                ids[name] = (await manager.save(owner, memory)).memory.id
        finally:
            await manager.close()
            await db.close()

    asyncio.run(write())
    with psycopg.connect(cluster_db.superuser_url) as conn:
        conn.execute(GLOBAL_FLAG_SET)
        conn.execute(
            "insert into harbor.memories (tenant_id, id, scope, principal_id, content,"
            " content_hash) values ('', %s, 'global', 'admin', 'global: for everyone',"
            " md5('global') || md5('everyone')) on conflict do nothing",
            (GLOBAL_ID,),
        )
    return ids


def _params(owner: MemoryOwner, ids: list[str], **overrides: Any) -> dict[str, Any]:
    """get_memories_delegated's parameters for ``owner`` (``overrides``: what an attacker
    changes)."""
    return {**carried_identity(owner), "ids": ids, **overrides}


def _get(cluster_db: ClusterDatabase, memory_id: str) -> tuple[Any, list[tuple[int, str]]]:
    """The facade's get of ``memory_id`` for ann, and the commands Citus sent."""
    found: list[Any] = []

    async def run(manager: MemoryManager) -> None:
        found.append(await manager.get(ANN, memory_id))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    return found[0], sent


def test_the_facades_get_is_one_call_on_the_tenants_worker(
    cluster_db: ClusterDatabase, stored: dict[str, str]
) -> None:
    memory, sent = _get(cluster_db, stored["ann"])
    assert memory is not None and memory.content == "ann: the delegated get"
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == cluster_db.node_of(ANN.tenant_id).port
    assert re.match(r"SELECT .* FROM harbor\.get_memories_delegated\('get-a'::text", command)


@pytest.mark.parametrize("name", ["global", "bob"])
def test_a_get_the_tenant_has_not_then_reads_the_global_shard(
    cluster_db: ClusterDatabase, stored: dict[str, str], name: str
) -> None:
    memory, sent = _get(cluster_db, GLOBAL_ID if name == "global" else stored[name])
    if name == "global":
        assert memory is not None and memory.content == "global: for everyone"
    else:
        assert memory is None  # another tenant's: the global shard has it not either
    assert _queries(sent) == sent
    assert [port for port, _command in sent] == [
        cluster_db.node_of(ANN.tenant_id).port,
        cluster_db.node_of("").port,
    ]


def test_the_delegated_call_answers_as_the_coordinators_statement_and_one_servers(
    cluster_db: ClusterDatabase, stored: dict[str, str]
) -> None:
    # from the delegated call in autocommit (the shard table's prepared statement on the
    # worker, twice: the second runs what the first prepared), from the same function in a
    # transaction (the coordinator's statement), and one server's get_memories under the
    # same identity (which reads the global memories too: with get_global_memories)
    ids = [*stored.values(), GLOBAL_ID, "no-such-memory"]
    params = _params(ANN, ids)
    with psycopg.connect(cluster_db.app_url, autocommit=True) as conn:
        delegated = conn.execute(query("get_memories_delegated"), params).fetchall()
        again = conn.execute(query("get_memories_delegated"), params).fetchall()
        shared = conn.execute(query("get_global_memories"), params).fetchall()
    with psycopg.connect(cluster_db.app_url) as conn:
        coordinated = conn.execute(query("get_memories_delegated"), params).fetchall()
    with psycopg.connect(cluster_db.app_url) as conn:
        for setting, value in carried_identity(ANN).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        one_server = conn.execute(
            query("get_memories"), {"tenant_id": ANN.tenant_id, "ids": ids}
        ).fetchall()
    # (each ending with the marker that global memories may exist: every column null)
    for answer in (delegated, again, coordinated):
        assert set(answer[-1]) == {None}
        assert all(r[0] is not None for r in answer[:-1])
    delegated, again, coordinated = delegated[:-1], again[:-1], coordinated[:-1]
    assert sorted(delegated) == sorted(again) == sorted(coordinated)
    assert sorted(delegated + shared) == sorted(one_server)
    assert sorted(r[9] for r in delegated) == ["ann: s1's", "ann: the delegated get"]
    assert [r[9] for r in shared] == ["global: for everyone"]


def test_the_stores_get_many_reads_both_shards(
    cluster_db: ClusterDatabase, stored: dict[str, str]
) -> None:
    async def run() -> list[str]:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=2, max_size=2)
        await db.open()
        try:
            found = await PostgresLongTermStore(db).get_many(ANN, [*stored.values(), GLOBAL_ID])
            return sorted(m.content for m in found)
        finally:
            await db.close()

    assert asyncio.run(run()) == ["ann: s1's", "ann: the delegated get", "global: for everyone"]


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase, stored: dict[str, str]) -> Iterator[str]:
    """A login bound to tenant get-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, "get-a", "ann") as role:
        yield role


def test_a_bound_role_reads_its_own_memories(
    cluster_db: ClusterDatabase, stored: dict[str, str], bound_role: str
) -> None:
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(
            query("get_memories_delegated"), _params(ANN, list(stored.values()))
        ).fetchall()
    assert set(rows[-1]) == {None}  # (the marker)
    assert sorted(r[9] for r in rows[:-1]) == ["ann: s1's", "ann: the delegated get"]


ATTACKS = attacks("get-b")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, stored: dict[str, str], bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read, whatever the way
    assert_refused(
        cluster_db,
        bound_role,
        query("get_memories_delegated"),
        _params(ANN, list(stored.values()), **ATTACKS[attack]),
        how,
    )
