"""On the cluster, the facade deletes one of the caller's memories in one call that Citus
delegates to the tenant's worker (harbor.delete_memory_delegated, sql/citus/delete.sql):
one command to one node, with no BEGIN, SET LOCAL or COMMIT, deleting what the
coordinator's statement and one server's delete_memory delete (the caller's own memory,
not another user's; the versions it superseded unlinked by the shard's trigger). The
identity the call carries as arguments is checked on the worker against the caller's
binding, so a bound role that names another tenant or user is refused before anything is
read or deleted."""

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
from harbor_pg.records import Memory
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

ANN = MemoryOwner(tenant_id="delete-a", principal_id="ann", session_id="s1")
CARL = MemoryOwner(tenant_id="delete-a", principal_id="carl", session_id="s1")
BOB = MemoryOwner(tenant_id="delete-b", principal_id="bob", session_id="s1")
ROLE = "harbor_test_delete_bound"


def _save(db: ClusterDatabase, owner: MemoryOwner, *texts: str) -> list[str]:
    """``texts`` saved as ``owner``'s memories through the facade (the application role)."""

    async def run() -> list[str]:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        try:
            return [(await manager.save(owner, Memory(content=t))).memory.id for t in texts]
        finally:
            await manager.close()
            await database.close()

    return asyncio.run(run())


def _exists(db: ClusterDatabase, *ids: str) -> list[bool]:
    with psycopg.connect(db.superuser_url) as conn:
        found = {
            r[0]
            for r in conn.execute(
                "select id from harbor.memories where id = any (%s)", (list(ids),)
            ).fetchall()
        }
    return [i in found for i in ids]


def _params(owner: MemoryOwner, memory_id: str, **overrides: Any) -> dict[str, Any]:
    """delete_memory_delegated's parameters for ``owner`` (``overrides``: what an attacker
    changes)."""
    return {**carried_identity(owner), "id": memory_id, **overrides}


def test_the_facades_delete_is_one_call_on_the_tenants_worker(
    cluster_db: ClusterDatabase,
) -> None:
    [memory_id] = _save(cluster_db, ANN, "ann: to be deleted by the facade")
    found: list[bool] = []

    async def run(manager: MemoryManager) -> None:
        found.append(await manager.delete(ANN, memory_id))
        found.append(await manager.delete(ANN, memory_id))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(sent) == 2, sent
    for to, command in sent:
        assert to == cluster_db.node_of(ANN.tenant_id).port
        assert re.match(r"SELECT .* FROM harbor\.delete_memory_delegated\('delete-a'::", command)
    assert found == [True, False]
    assert _exists(cluster_db, memory_id) == [False]


def test_the_delegated_call_deletes_what_the_coordinators_statement_and_one_servers_do(
    cluster_db: ClusterDatabase,
) -> None:
    # each way deletes one of ann's memories, and none of carl's or bob's: the delegated
    # call in autocommit (twice: the second runs what the first prepared), the same
    # function in a transaction (the coordinator's statement), and one server's
    # delete_memory under the same identity
    mine = _save(cluster_db, ANN, "ann: one", "ann: two", "ann: three", "ann: four")
    [carls] = _save(cluster_db, CARL, "carl: his own")
    [bobs] = _save(cluster_db, BOB, "bob: another tenant's")
    outcomes = []
    with psycopg.connect(cluster_db.app_url, autocommit=True) as conn:
        for memory_id in (mine[0], mine[1], carls, bobs):
            outcomes.append(
                conn.execute(query("delete_memory_delegated"), _params(ANN, memory_id)).fetchall()
            )
    with psycopg.connect(cluster_db.app_url) as conn:
        for memory_id in (mine[2], carls, bobs):
            outcomes.append(
                conn.execute(query("delete_memory_delegated"), _params(ANN, memory_id)).fetchall()
            )
    with psycopg.connect(cluster_db.app_url) as conn:
        for setting, value in carried_identity(ANN).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        for memory_id in (mine[3], carls, bobs):
            outcomes.append(
                conn.execute(
                    query("delete_memory"), {"tenant_id": ANN.tenant_id, "id": memory_id}
                ).fetchall()
            )
    assert outcomes == [
        [(mine[0],)], [(mine[1],)], [], [],
        [(mine[2],)], [], [],
        [(mine[3],)], [], [],
    ]  # fmt: skip
    assert _exists(cluster_db, *mine, carls, bobs) == [False] * 4 + [True, True]


def test_a_deleted_successor_leaves_the_versions_it_replaced_unlinked(
    cluster_db: ClusterDatabase,
) -> None:
    # a consolidation's successor (the members' superseded_by) deleted by the delegated
    # call: the shard's trigger clears the links, as on one server the key's action does
    owner = MemoryOwner(tenant_id="delete-a", principal_id="dora", session_id="s1")

    async def run() -> tuple[str, list[str], bool]:
        database = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        try:
            await manager.save(owner, Memory(content="dora: tea at noon"))
            await manager.save(owner, Memory(content="Dora: tea at noon!"))
            [merge] = (await manager.consolidate(owner)).merges
            assert merge.successor_id is not None
            deleted = await manager.delete(owner, merge.successor_id)
            return merge.successor_id, list(merge.merged_ids), deleted
        finally:
            await manager.close()
            await database.close()

    successor, members, deleted = asyncio.run(run())
    assert deleted
    with psycopg.connect(cluster_db.superuser_url) as conn:
        links = conn.execute(
            "select superseded_by from harbor.memories where tenant_id = 'delete-a'"
            " and id = any (%s)",
            (members,),
        ).fetchall()
    assert links == [(None,), (None,)]
    assert _exists(cluster_db, successor) == [False]


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant delete-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, "delete-a", "ann") as role:
        yield role


def test_a_bound_role_deletes_its_own_memory(cluster_db: ClusterDatabase, bound_role: str) -> None:
    [memory_id] = _save(cluster_db, ANN, "ann: deleted by the bound role")
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("delete_memory_delegated"), _params(ANN, memory_id)).fetchall()
    assert rows == [(memory_id,)]


ATTACKS = attacks("delete-b")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read, and the memory it names (bob's or carl's) is still there
    target = BOB if attack.startswith("another tenant") else CARL
    [memory_id] = _save(cluster_db, target, f"{target.principal_id}: not ann's to delete")
    assert_refused(
        cluster_db,
        bound_role,
        query("delete_memory_delegated"),
        _params(ANN, memory_id, **ATTACKS[attack]),
        how,
    )
    assert _exists(cluster_db, memory_id) == [True]
