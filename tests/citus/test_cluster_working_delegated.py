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


def _rows(url: str, owner: MemoryOwner) -> list[tuple[int, Any]]:
    """(id, state) of every version of ``owner``'s run, newest first (superuser)."""
    with psycopg.connect(url) as conn:
        return [
            (int(r[0]), r[1])
            for r in conn.execute(
                "select id, state from harbor.working_state where tenant_id = %s"
                " and user_id = %s and session_id = %s and run_id = %s order by id desc",
                (owner.tenant_id, owner.principal_id, owner.session_id, owner.run_id),
            ).fetchall()
        ]


def test_the_facades_working_state_write_is_one_call_on_the_tenants_worker(
    stored: ClusterDatabase,
) -> None:
    owner = MemoryOwner(tenant_id="working-a", principal_id="ann", session_id="s1", run_id="w1")
    found: list[dict[str, Any]] = []

    async def run(manager: MemoryManager) -> None:
        found.append(await manager.update(owner, {"a": 1, "b": [1, 2]}))

    sent = asyncio.run(_facade_commands(stored, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == stored.node_of(owner.tenant_id).port
    assert re.match(r"SELECT .* FROM harbor\.working_update_delegated\('working-a'::text", command)
    assert found == [{"a": 1, "b": [1, 2]}]


def test_the_delegated_write_merges_and_keeps_one_version_as_one_server_does(
    stored: ClusterDatabase,
) -> None:
    # each write merges its keys into the newest state and drops the older versions; a
    # TTL hides the state once it passes (and the next write starts from nothing)
    owner = MemoryOwner(tenant_id="working-a", principal_id="ann", session_id="s1", run_id="w2")

    async def run() -> list[dict[str, Any]]:
        db = Database(stored.app_url, stored.admin_url, min_size=1, max_size=1)
        await db.open()
        manager = MemoryManager.from_database(db)
        try:
            seen = [await manager.update(owner, {"step": 1, "plan": "draft"})]
            seen.append(await manager.update(owner, {"step": 2}))
            seen.append(await manager.scratch(owner))
            seen.append(await manager.update(owner, {"gone": True}, ttl_seconds=0.001))
            await asyncio.sleep(0.05)
            seen.append(await manager.scratch(owner))
            seen.append(await manager.update(owner, {"after": 1}))
            return seen
        finally:
            await manager.close()
            await db.close()

    assert asyncio.run(run()) == [
        {"step": 1, "plan": "draft"},
        {"step": 2, "plan": "draft"},
        {"step": 2, "plan": "draft"},
        {"step": 2, "plan": "draft", "gone": True},
        {},
        {"after": 1},
    ]
    # the expired version stays (invisible) until the purge; the visible ones are one
    states = [state for _id, state in _rows(stored.superuser_url, owner)]
    assert states == [{"after": 1}, {"step": 2, "plan": "draft", "gone": True}]


def test_a_version_written_on_the_worker_stays_above_the_runs_newest(
    stored: ClusterDatabase,
) -> None:
    # a version with an id above the worker's range (as a tenant moved from a node with
    # a higher range would have): the next write's id is above it, merges its state, and
    # drops it
    owner = MemoryOwner(tenant_id="working-a", principal_id="ann", session_id="s1", run_id="w3")
    high = 2**62
    with psycopg.connect(stored.superuser_url) as conn:
        conn.execute(
            "insert into harbor.working_state (tenant_id, id, user_id, session_id, run_id,"
            " principal_id, state) overriding system value values (%s, %s, %s, %s, %s, %s,"
            " '{\"moved\": true}')",
            (owner.tenant_id, high, "ann", "s1", "w3", "ann"),
        )
    with psycopg.connect(stored.app_url, autocommit=True) as conn:
        [row] = conn.execute(
            query("working_update_delegated"),
            {**carried_identity(owner), "state": '{"next": 1}', "ttl_seconds": None},
        ).fetchall()
    assert row[0] == {"moved": True, "next": 1}
    [(version, state)] = _rows(stored.superuser_url, owner)
    assert version > high and state == {"moved": True, "next": 1}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_a_write_is_refused(
    stored: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    params = {**_params(ANN, **ATTACKS[attack]), "state": '{"forged": 1}', "ttl_seconds": None}
    with psycopg.connect(stored.superuser_url) as conn:
        before = conn.execute("select count(*) from harbor.working_state").fetchone()
    assert_refused(stored, bound_role, query("working_update_delegated"), params, how)
    with psycopg.connect(stored.superuser_url) as conn:
        after = conn.execute("select count(*) from harbor.working_state").fetchone()
    assert after == before
