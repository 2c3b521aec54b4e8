"""On the cluster, the caller's memories past their expiry are closed
(PostgresLongTermStore.expire_memories: harbor.expire_memories() as the application role)
in one call that Citus delegates to the tenant's worker (harbor.expire_memories_delegated,
sql/citus/expire.sql): one command to one node, with no BEGIN, SET LOCAL or COMMIT,
closing what the coordinator's statement and one server's harbor.expire_memories() close
(the caller's own expired memories, each at its expiry; not another user's, not another
tenant's, not one still to expire). The identity the call carries as arguments is checked
on the worker against the caller's binding, so a bound role that names another tenant or
user is refused before anything is read or written."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
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

ANN = MemoryOwner(tenant_id="expire-a", principal_id="ann", session_id="s1")
CARL = MemoryOwner(tenant_id="expire-a", principal_id="carl", session_id="s1")
BOB = MemoryOwner(tenant_id="expire-b", principal_id="bob", session_id="s1")
ROLE = "harbor_test_expire_bound"
DAY = timedelta(days=1)


def _save(db: ClusterDatabase, owner: MemoryOwner, *texts: str, expires: bool = True) -> list[str]:
    """``texts`` saved as ``owner``'s user memories through the facade (the application
    role), valid from two days ago and expired a day ago (``expires``: else next year)."""
    now = datetime.now(UTC)
    expires_at = now - DAY if expires else now + 365 * DAY

    async def run() -> list[str]:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        try:
            return [
                (
                    await manager.save(
                        owner,
                        Memory(
                            content=t,
                            scope=MemoryScope.USER,
                            valid_from=now - 2 * DAY,
                            expires_at=expires_at,
                        ),
                    )
                ).memory.id
                for t in texts
            ]
        finally:
            await manager.close()
            await database.close()

    return asyncio.run(run())


def _open(db: ClusterDatabase, *ids: str) -> list[bool]:
    """Whether each memory is stored with its interval still open (a closed one closed at
    its expiry, as harbor.expire_memories() closes it)."""
    with psycopg.connect(db.superuser_url) as conn:
        rows = conn.execute(
            "select id, upper_inf(valid), upper(valid) = expires_at from harbor.memories"
            " where id = any (%s)",
            (list(ids),),
        ).fetchall()
    assert len(rows) == len(ids)
    assert all(is_open or at_expiry for _id, is_open, at_expiry in rows), rows
    found = {memory_id: is_open for memory_id, is_open, _at in rows}
    return [bool(found[i]) for i in ids]


def test_the_facades_expiry_is_one_call_on_the_tenants_worker(
    cluster_db: ClusterDatabase,
) -> None:
    expired = _save(cluster_db, ANN, "ann: expired one", "ann: expired two")
    [current] = _save(cluster_db, ANN, "ann: expires next year", expires=False)
    closed: list[int] = []

    async def run(manager: MemoryManager) -> None:
        assert manager.database is not None
        store = PostgresLongTermStore(manager.database)
        closed.append(await store.expire_memories(ANN))
        closed.append(await store.expire_memories(ANN))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert [to for to, _c in sent] == [cluster_db.node_of("expire-a").port] * 2, sent
    assert all(
        re.match(r"SELECT harbor\.expire_memories_delegated\('expire-a'::text", c)
        for _to, c in sent
    ), sent
    assert closed == [2, 0]
    assert _open(cluster_db, *expired, current) == [False, False, True]


def test_the_delegated_call_closes_what_the_coordinators_statement_and_one_servers_do(
    cluster_db: ClusterDatabase,
) -> None:
    # the delegated call in autocommit (twice: the second runs what the first prepared),
    # the same function in a transaction (the coordinator's statement) and one server's
    # harbor.expire_memories() under the same identity, each after one more of ann's
    # memories expired: each closes ann's, and carl's and bob's stay open
    [carls] = _save(cluster_db, CARL, "carl: not ann's to close")
    [bobs] = _save(cluster_db, BOB, "bob: another tenant's")
    call = query("expire_memories_delegated")
    closed: list[Any] = []
    ids: list[str] = []
    ids += _save(cluster_db, ANN, "ann: delegated")
    with psycopg.connect(cluster_db.app_url, autocommit=True) as conn:
        closed.append(conn.execute(call, carried_identity(ANN)).fetchall())
        closed.append(conn.execute(call, carried_identity(ANN)).fetchall())
    ids += _save(cluster_db, ANN, "ann: coordinated")
    with psycopg.connect(cluster_db.app_url) as conn:
        closed.append(conn.execute(call, carried_identity(ANN)).fetchall())
    ids += _save(cluster_db, ANN, "ann: one server")
    with psycopg.connect(cluster_db.app_url) as conn:
        for setting, value in carried_identity(ANN).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        closed.append(conn.execute(query("expire_memories")).fetchall())
    assert closed == [[(1,)], [(0,)], [(1,)], [(1,)]]
    assert _open(cluster_db, *ids, carls, bobs) == [False, False, False, True, True]


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant expire-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, "expire-a", "ann") as role:
        yield role


def test_a_bound_role_closes_its_own(cluster_db: ClusterDatabase, bound_role: str) -> None:
    [memory_id] = _save(cluster_db, ANN, "ann: closed by the bound role")
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("expire_memories_delegated"), carried_identity(ANN)).fetchall()
    assert rows == [(1,)]
    assert _open(cluster_db, memory_id) == [False]


ATTACKS = attacks("expire-b")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read, and the expired memory of the owner it names (bob's or carl's) is still open
    target = BOB if attack.startswith("another tenant") else CARL
    [memory_id] = _save(cluster_db, target, f"{target.principal_id}: attacked {attack} {how}")
    assert_refused(
        cluster_db,
        bound_role,
        query("expire_memories_delegated"),
        {**carried_identity(ANN), **ATTACKS[attack]},
        how,
    )
    assert _open(cluster_db, memory_id) == [True]
