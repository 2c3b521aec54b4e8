"""On the cluster, a current memory is closed with no successor (PostgresLongTermStore.
close_memory: an observation whose facts fell away, MemoryManager.observe) in one call
that Citus delegates to the tenant's worker (harbor.close_memory_delegated,
sql/citus/close.sql): one command to one node, with no BEGIN, SET LOCAL or COMMIT,
closing what the coordinator's statement and one server's close_memory close (the
caller's own current memory, once; not another user's). The identity the call carries as
arguments is checked on the worker against the caller's binding, so a bound role that
names another tenant or user is refused before anything is read or written."""

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
from harbor_pg.records import Memory, MemoryScope
from harbor_pg.tiers.long_term import PostgresLongTermStore
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

ANN = MemoryOwner(tenant_id="close-a", principal_id="ann", session_id="s1")
CARL = MemoryOwner(tenant_id="close-a", principal_id="carl", session_id="s1")
ROLE = "harbor_test_close_bound"


def _save(db: ClusterDatabase, owner: MemoryOwner, *texts: str) -> list[str]:
    """``texts`` saved as ``owner``'s user memories through the facade (the application
    role)."""

    async def run() -> list[str]:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        try:
            return [
                (await manager.save(owner, Memory(content=t, scope=MemoryScope.USER))).memory.id
                for t in texts
            ]
        finally:
            await manager.close()
            await database.close()

    return asyncio.run(run())


def _open(db: ClusterDatabase, *ids: str) -> list[bool]:
    """Whether each memory is stored with its interval still open."""
    with psycopg.connect(db.superuser_url) as conn:
        found = dict(
            conn.execute(
                "select id, upper_inf(valid) from harbor.memories where id = any (%s)",
                (list(ids),),
            ).fetchall()
        )
    return [bool(found.get(i)) for i in ids]


def _params(owner: MemoryOwner, memory_id: str, **overrides: Any) -> dict[str, Any]:
    """close_memory_delegated's parameters for ``owner``'s user memory ``memory_id``
    (``overrides``: what an attacker changes)."""
    key = owner.key(MemoryScope.USER)
    return {
        **carried_identity(owner),
        **{f"key_{f}": v for f, v in key.items() if f != "tenant_id"},
        "scope": "user",
        "id": memory_id,
        **overrides,
    }


def test_the_facades_close_is_one_call_on_the_tenants_worker(
    cluster_db: ClusterDatabase,
) -> None:
    [memory_id] = _save(cluster_db, ANN, "ann: to be closed by the facade")
    found: list[bool] = []

    async def run(manager: MemoryManager) -> None:
        assert manager.database is not None
        store = PostgresLongTermStore(manager.database)
        found.append(await store.close_memory(ANN, memory_id, MemoryScope.USER))
        found.append(await store.close_memory(ANN, memory_id, MemoryScope.USER))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert [to for to, _c in sent] == [cluster_db.node_of("close-a").port] * 2, sent
    assert all(
        re.match(r"SELECT .* FROM harbor\.close_memory_delegated\('close-a'::text", c)
        for _to, c in sent
    )
    assert found == [True, False]  # (closed once)
    assert _open(cluster_db, memory_id) == [False]


def test_the_delegated_call_closes_what_the_coordinators_statement_and_one_servers_do(
    cluster_db: ClusterDatabase,
) -> None:
    # the delegated call in autocommit, the same function in a transaction (the
    # coordinator's statement) and one server's close_memory under the same identity, each
    # for a memory of ann's: each closed once; carl's, named with ann's identity, not
    ids = _save(cluster_db, ANN, "ann: delegated", "ann: coordinated", "ann: one server")
    [carls] = _save(cluster_db, CARL, "carl: not ann's to close")
    call = query("close_memory_delegated")
    closed: list[list[Any]] = []
    with psycopg.connect(cluster_db.app_url, autocommit=True) as conn:
        closed.append(conn.execute(call, _params(ANN, ids[0])).fetchall())
        closed.append(conn.execute(call, _params(ANN, ids[0])).fetchall())  # (closed already)
        closed.append(conn.execute(call, _params(ANN, carls)).fetchall())
    with psycopg.connect(cluster_db.app_url) as conn:
        closed.append(conn.execute(call, _params(ANN, ids[1])).fetchall())
    with psycopg.connect(cluster_db.app_url) as conn:
        for setting, value in carried_identity(ANN).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        closed.append(
            conn.execute(
                query("close_memory"),
                {**ANN.key(MemoryScope.USER), "scope": "user", "id": ids[2]},
            ).fetchall()
        )
    assert closed == [[(ids[0],)], [], [], [(ids[1],)], [(ids[2],)]]
    assert _open(cluster_db, *ids, carls) == [False, False, False, True]


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant close-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, "close-a", "ann") as role:
        yield role


def test_a_bound_role_closes_its_own(cluster_db: ClusterDatabase, bound_role: str) -> None:
    [memory_id] = _save(cluster_db, ANN, "ann: closed by the bound role")
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("close_memory_delegated"), _params(ANN, memory_id)).fetchall()
    assert rows == [(memory_id,)]
    assert _open(cluster_db, memory_id) == [False]


ATTACKS = attacks("close-b")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read, and carl's memory is still open
    [carls] = _save(cluster_db, CARL, f"carl: attacked {attack} {how}")
    key = {"key_user_id": ATTACKS[attack].get("user_id", "ann")}
    assert_refused(
        cluster_db,
        bound_role,
        query("close_memory_delegated"),
        _params(ANN, carls, **ATTACKS[attack], **key),
        how,
    )
    assert _open(cluster_db, carls) == [True]
