"""On the cluster, the facade deletes a session's turns (clear) and a run's working state
(clear_working) each in one call that Citus delegates to the tenant's worker
(harbor.clear_session_delegated, harbor.clear_working_delegated, sql/citus/clear.sql):
one command to one node, with no BEGIN, SET LOCAL or COMMIT, deleting what the
coordinator's statement and one server's clear_messages and clear_working delete. The
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
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.short_term import session_key
from harbor_pg.tiers.working import run_key
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

TENANT, OTHER = "clear-a", "clear-b"
ROLE = "harbor_test_clear_bound"


def _owner(user: str, session: str, run: str = "r1", tenant: str = TENANT) -> MemoryOwner:
    return MemoryOwner(tenant_id=tenant, principal_id=user, session_id=session, run_id=run)


def _write(db: ClusterDatabase, owners: list[MemoryOwner], turns: int = 3) -> None:
    """``turns`` turns of each owner's session and two versions of its run's state, through
    the facade (the application role)."""

    async def run() -> None:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        try:
            for owner in owners:
                for k in range(turns):
                    await manager.append(owner, ConversationMessage(role="user", content=f"{k}"))
                await manager.update(owner, {"step": 1})
                await manager.update(owner, {"step": 2})
        finally:
            await manager.close()
            await database.close()

    asyncio.run(run())


def _left(db: ClusterDatabase, owner: MemoryOwner) -> tuple[int, int]:
    """How many turns of ``owner``'s session and rows of its run's state are stored."""
    with psycopg.connect(db.superuser_url) as conn:
        row = conn.execute(
            "select (select count(*) from harbor.messages where tenant_id = %(t)s"
            "          and user_id = %(u)s and session_id = %(s)s),"
            "       (select count(*) from harbor.working_state where tenant_id = %(t)s"
            "          and user_id = %(u)s and session_id = %(s)s and run_id = %(r)s)",
            {"t": owner.tenant_id, "u": owner.user_id, "s": owner.session_id, "r": owner.run_id},
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_the_facades_clears_are_one_call_each_on_the_tenants_worker(
    cluster_db: ClusterDatabase,
) -> None:
    owner = _owner("ann", "facade")
    _write(cluster_db, [owner])
    found: list[int] = []

    async def run(manager: MemoryManager) -> None:
        found.append(await manager.clear(owner))
        found.append(await manager.clear_working(owner))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert [to for to, _command in sent] == [cluster_db.node_of(TENANT).port] * 2, sent
    assert re.match(r"SELECT harbor\.clear_session_delegated\('clear-a'::text", sent[0][1])
    assert re.match(r"SELECT harbor\.clear_working_delegated\('clear-a'::text", sent[1][1])
    assert found == [3, 1]  # (an update keeps the run's newest version alone)
    assert _left(cluster_db, owner) == (0, 0)


@pytest.mark.parametrize("what", ["session", "working"])
def test_the_delegated_call_deletes_what_the_coordinators_statement_and_one_servers_do(
    cluster_db: ClusterDatabase, what: str
) -> None:
    # the delegated call in autocommit, the same function in a transaction (the
    # coordinator's statement) and one server's statement under the same identity, each
    # for a session (and run) of ann's: the same count, and nothing of carl's deleted
    ways = [_owner("ann", f"{what}-{way}") for way in ("delegated", "coordinated", "one")]
    carl = _owner("carl", f"{what}-delegated")
    _write(cluster_db, [*ways, carl])
    delegated, coordinated, one = ways
    call = query(f"clear_{what}_delegated")
    with psycopg.connect(cluster_db.app_url, autocommit=True) as conn:
        counts = [conn.execute(call, carried_identity(delegated)).fetchone()]
        counts.append(conn.execute(call, carried_identity(delegated)).fetchone())  # (none left)
    with psycopg.connect(cluster_db.app_url) as conn:
        counts.append(conn.execute(call, carried_identity(coordinated)).fetchone())
    with psycopg.connect(cluster_db.app_url) as conn:
        for setting, value in carried_identity(one).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        if what == "session":
            cur = conn.execute(query("clear_messages"), session_key(one))
        else:
            cur = conn.execute(query("clear_working"), run_key(one))
        counts.append((cur.rowcount,))
    expected = 3 if what == "session" else 1
    assert counts == [(expected,), (0,), (expected,), (expected,)]
    index = 0 if what == "session" else 1
    assert [_left(cluster_db, o)[index] for o in ways] == [0, 0, 0]
    assert _left(cluster_db, carl) == (3, 1)


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant clear-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, TENANT, "ann") as role:
        yield role


def test_a_bound_role_clears_its_own(cluster_db: ClusterDatabase, bound_role: str) -> None:
    owner = _owner("ann", "bound")
    _write(cluster_db, [owner])
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        for what in ("session", "working"):
            conn.execute(query(f"clear_{what}_delegated"), carried_identity(owner))
    assert _left(cluster_db, owner) == (0, 0)


ATTACKS = attacks(OTHER)


@pytest.mark.parametrize("what", ["session", "working"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str, what: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read, and what it named (bob's or carl's) is still there
    params: dict[str, Any] = {**carried_identity(_owner("ann", "attacked")), **ATTACKS[attack]}
    target = _owner(params["user_id"] or "ann", "attacked", tenant=params["tenant_id"])
    _write(cluster_db, [target])
    before = _left(cluster_db, target)
    assert_refused(cluster_db, bound_role, query(f"clear_{what}_delegated"), params, how)
    assert _left(cluster_db, target) == before
