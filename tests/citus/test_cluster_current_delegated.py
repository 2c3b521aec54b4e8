"""On the cluster, the facade lists the caller's current memories in one call that Citus
delegates to the tenant's worker (harbor.current_memories_delegated,
sql/citus/current.sql): one command to one node, with no BEGIN, SET LOCAL or COMMIT,
answering as the coordinator's statement and one server's extraction_current_memories
do. The identity the call carries as arguments is checked on the worker against the
caller's binding, so a bound role that names another tenant or user is refused before
anything is read."""

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
from harbor_pg.tiers.rows import current_memories_params
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

ANN = MemoryOwner(tenant_id="current-a", principal_id="ann", session_id="s1")
ANN_S2 = MemoryOwner(tenant_id="current-a", principal_id="ann", session_id="s2")
CARL = MemoryOwner(tenant_id="current-a", principal_id="carl", session_id="s1")
BOB = MemoryOwner(tenant_id="current-b", principal_id="bob", session_id="s1")
ROLE = "harbor_test_current_bound"
SCOPES = [MemoryScope.USER, MemoryScope.SESSION, MemoryScope.PROJECT]
ANNS = ["ann: s1's note", "ann: tea in the morning", "ann: the sister in Oslo"]


@pytest.fixture(scope="module")
def stored(cluster_db: ClusterDatabase) -> ClusterDatabase:
    # each owner's memories saved through the facade as the application role
    async def write() -> None:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        manager = MemoryManager.from_database(db)
        try:
            for owner, memory in (
                (ANN, Memory(content="ann: tea in the morning")),
                (ANN, Memory(content="ann: the sister in Oslo")),
                (ANN, Memory(content="ann: s1's note", scope=MemoryScope.SESSION)),
                (ANN_S2, Memory(content="ann: s2's note", scope=MemoryScope.SESSION)),
                (CARL, Memory(content="carl: his own")),
                (BOB, Memory(content="bob: another tenant's")),
            ):
                await manager.save(owner, memory)
        finally:
            await manager.close()
            await db.close()

    asyncio.run(write())
    return cluster_db


def _params(owner: MemoryOwner, **overrides: Any) -> dict[str, Any]:
    """current_memories_delegated's parameters for ``owner`` (``overrides``: what an
    attacker changes)."""
    keys = current_memories_params(owner, SCOPES, 100)
    assert keys is not None
    return {**keys, **carried_identity(owner), **overrides}


def test_the_facades_current_memories_are_one_call_on_the_tenants_worker(
    stored: ClusterDatabase,
) -> None:
    found: list[Any] = []

    async def run(manager: MemoryManager) -> None:
        found.extend(await manager.current_memories(ANN))

    sent = asyncio.run(_facade_commands(stored, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == stored.node_of(ANN.tenant_id).port
    assert re.match(
        r"SELECT .* FROM harbor\.current_memories_delegated\('current-a'::text", command
    )
    assert sorted(m.content for m in found) == ANNS


@pytest.mark.parametrize("owner", [ANN, ANN_S2], ids=["s1", "s2"])
def test_the_delegated_call_answers_as_the_coordinators_statement_and_one_servers(
    stored: ClusterDatabase, owner: MemoryOwner
) -> None:
    # from the delegated call in autocommit (the shard table's prepared statement on the
    # worker, twice: the second runs what the first prepared), from the same function in a
    # transaction (the coordinator's statement), and one server's
    # extraction_current_memories under the same identity
    params = _params(owner)
    with psycopg.connect(stored.app_url, autocommit=True) as conn:
        delegated = conn.execute(query("current_memories_delegated"), params).fetchall()
        again = conn.execute(query("current_memories_delegated"), params).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        coordinated = conn.execute(query("current_memories_delegated"), params).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        for setting, value in carried_identity(owner).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        one_server = conn.execute(query("extraction_current_memories"), params).fetchall()
    assert delegated == again == coordinated == one_server
    session_note = f"ann: {owner.session_id}'s note"
    assert sorted(r[9] for r in delegated) == sorted([session_note, *ANNS[1:]])


@pytest.fixture(scope="module")
def bound_role(stored: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant current-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(stored, ROLE, "current-a", "ann") as role:
        yield role


def test_a_bound_role_lists_its_own_memories(stored: ClusterDatabase, bound_role: str) -> None:
    with psycopg.connect(stored.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("current_memories_delegated"), _params(ANN)).fetchall()
    assert sorted(r[9] for r in rows) == ANNS


ATTACKS = attacks("current-b")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    stored: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read, whatever the way (its key parameters naming its own user)
    assert_refused(
        stored,
        bound_role,
        query("current_memories_delegated"),
        _params(ANN, **ATTACKS[attack]),
        how,
    )
