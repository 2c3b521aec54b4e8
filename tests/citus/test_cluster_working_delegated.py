"""On the cluster, the facade reads a run's working state in one call that Citus delegates
to the tenant's worker (harbor.working_state_delegated, sql/citus/working.sql): one
command to one node, with no BEGIN, SET LOCAL or COMMIT, answering as the coordinator's
statement and one server's scratch statement do, an expired state unread. The identity
the call carries as arguments is checked on the worker against the caller's binding, so
a bound role that names another tenant or user is refused before anything is read."""

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
from harbor_pg.tiers.working import run_key
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

ANN = MemoryOwner(tenant_id="working-a", principal_id="ann", session_id="s1", run_id="r1")
ANN_EXPIRED = MemoryOwner(tenant_id="working-a", principal_id="ann", session_id="s1", run_id="r2")
BOB = MemoryOwner(tenant_id="working-b", principal_id="bob", session_id="s1", run_id="r1")
ROLE = "harbor_test_working_bound"


@pytest.fixture(scope="module")
def stored(cluster_db: ClusterDatabase) -> ClusterDatabase:
    async def write() -> None:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        manager = MemoryManager.from_database(db)
        try:
            await manager.update(ANN, {"step": 1, "plan": "draft"})
            await manager.update(ANN, {"step": 2})
            await manager.update(ANN_EXPIRED, {"step": 9}, ttl_seconds=0.001)
            await manager.update(BOB, {"step": 7})
        finally:
            await manager.close()
            await db.close()

    asyncio.run(write())
    return cluster_db


def _params(owner: MemoryOwner, **overrides: Any) -> dict[str, Any]:
    """working_state_delegated's parameters for ``owner`` (``overrides``: what an attacker
    changes)."""
    return {**carried_identity(owner), **overrides}


def test_the_facades_working_state_read_is_one_call_on_the_tenants_worker(
    stored: ClusterDatabase,
) -> None:
    found: list[dict[str, Any]] = []

    async def run(manager: MemoryManager) -> None:
        found.append(await manager.scratch(ANN))

    sent = asyncio.run(_facade_commands(stored, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == stored.node_of(ANN.tenant_id).port
    assert re.match(r"SELECT .* FROM harbor\.working_state_delegated\('working-a'::text", command)
    assert found == [{"step": 2, "plan": "draft"}]


@pytest.mark.parametrize("owner", [ANN, ANN_EXPIRED], ids=["current", "expired"])
def test_the_delegated_call_answers_as_the_coordinators_statement_and_one_servers(
    stored: ClusterDatabase, owner: MemoryOwner
) -> None:
    # from the delegated call in autocommit (the shard table's prepared statement on the
    # worker, twice: the second runs what the first prepared), from the same function in a
    # transaction (the coordinator's statement), and one server's scratch statement under
    # the same identity
    with psycopg.connect(stored.app_url, autocommit=True) as conn:
        delegated = conn.execute(query("working_state_delegated"), _params(owner)).fetchall()
        again = conn.execute(query("working_state_delegated"), _params(owner)).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        coordinated = conn.execute(query("working_state_delegated"), _params(owner)).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        for setting, value in carried_identity(owner).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        one_server = conn.execute(query("scratch"), run_key(owner)).fetchall()
    assert delegated == again == coordinated == one_server
    expected = [] if owner is ANN_EXPIRED else [{"step": 2, "plan": "draft"}]
    assert [r[0] for r in delegated] == expected


@pytest.fixture(scope="module")
def bound_role(stored: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant working-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(stored, ROLE, "working-a", "ann") as role:
        yield role


def test_a_bound_role_reads_its_own_runs_state(stored: ClusterDatabase, bound_role: str) -> None:
    with psycopg.connect(stored.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("working_state_delegated"), _params(ANN)).fetchall()
    assert [r[0] for r in rows] == [{"step": 2, "plan": "draft"}]


ATTACKS = attacks("working-b")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    stored: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read, whatever the way
    assert_refused(
        stored,
        bound_role,
        query("working_state_delegated"),
        _params(ANN, **ATTACKS[attack]),
        how,
    )
