"""On the cluster, a session's background-summary lease is taken, finished and released
each in one call that Citus delegates to the tenant's worker
(harbor.summary_lease_acquire_delegated, harbor.summary_lease_end_delegated,
sql/citus/lease.sql): one command to one node, with no BEGIN, SET LOCAL or COMMIT, the
single-server statements run on the tenant's shard tables (taken once of concurrent
callers, held, finished: tests/citus/test_cluster_summaries.py). The identity the call
carries as arguments is checked on the worker against the caller's binding, so a bound
role that names another tenant or user is refused before anything is read or written."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.short_term import PostgresShortTermStore
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

TENANT = "lease-d"
ROLE = "harbor_test_lease_bound"


def test_the_lease_calls_are_one_call_each_on_the_tenants_worker(
    cluster_db: ClusterDatabase,
) -> None:
    owner = MemoryOwner(tenant_id=TENANT, principal_id="ann", session_id="facade")
    found: list[Any] = []

    async def run(manager: MemoryManager) -> None:
        for k in range(3):
            await manager.append(owner, ConversationMessage(role="user", content=f"{k}"))
        assert manager.database is not None
        store = PostgresShortTermStore(manager.database)
        lease = await store.acquire_summary_lease(
            owner, min_turns=3, cooldown_seconds=0, lease_seconds=60
        )
        assert lease is not None and lease.turns == 3
        found.append(
            await store.acquire_summary_lease(  # (held)
                owner, min_turns=3, cooldown_seconds=0, lease_seconds=60
            )
        )
        found.append(await store.release_summary_lease(owner, lease))
        again = await store.acquire_summary_lease(
            owner, min_turns=3, cooldown_seconds=0, lease_seconds=60
        )
        assert again is not None
        found.append(await store.finish_summary_lease(owner, again, turns_at_summary=3))
        found.append(await store.finish_summary_lease(owner, again, turns_at_summary=3))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    leases = [(to, c) for to, c in sent if "summary_lease_" in c]
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(leases) == 6, sent
    assert {to for to, _c in leases} == {cluster_db.node_of(TENANT).port}
    assert all(
        re.match(r"SELECT .* FROM harbor\.summary_lease_(acquire|end)_delegated\('lease-d'", c)
        for _to, c in leases
    )
    # held: none for the second caller; released, taken again; finished once
    assert found == [None, True, True, False]


def _params(owner: MemoryOwner, **overrides: Any) -> dict[str, Any]:
    return {
        **carried_identity(owner),
        "min_turns": 1,
        "cooldown_seconds": 0,
        "lease_seconds": 60,
        "lease_until": datetime.now(UTC),
        "turns_at_summary": 1,
        **overrides,
    }


def test_the_call_in_a_transaction_takes_the_lease_as_the_delegated_one(
    cluster_db: ClusterDatabase,
) -> None:
    # the same function called in a transaction (the coordinator's statements, over the
    # distributed tables) answers as delegated: the first takes it, the second finds it held
    owner = MemoryOwner(tenant_id=TENANT, principal_id="ann", session_id="coordinated")

    async def turn() -> None:
        from harbor_pg.db.connection import Database

        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        manager = MemoryManager.from_database(db)
        try:
            await manager.append(owner, ConversationMessage(role="user", content="hi"))
        finally:
            await manager.close()
            await db.close()

    asyncio.run(turn())
    with psycopg.connect(cluster_db.app_url) as conn:
        taken = conn.execute(query("summary_lease_acquire_delegated"), _params(owner)).fetchall()
    with psycopg.connect(cluster_db.app_url, autocommit=True) as conn:
        held = conn.execute(query("summary_lease_acquire_delegated"), _params(owner)).fetchall()
        [(until, _at, turns)] = taken
        ended = conn.execute(
            query("summary_lease_end_delegated"), _params(owner, lease_until=until)
        ).fetchall()
    assert turns == 1 and held == [] and ended == [("coordinated",)]


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant lease-d as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, TENANT, "ann") as role:
        yield role


ATTACKS = attacks("lease-e")


@pytest.mark.parametrize("call", ["acquire", "end"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str, call: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read or written
    owner = MemoryOwner(tenant_id=TENANT, principal_id="ann", session_id="attacked")
    assert_refused(
        cluster_db,
        bound_role,
        query(f"summary_lease_{call}_delegated"),
        _params(owner, **ATTACKS[attack]),
        how,
    )


def test_a_bound_role_takes_its_own_sessions_lease(
    cluster_db: ClusterDatabase, bound_role: str
) -> None:
    owner = MemoryOwner(tenant_id=TENANT, principal_id="ann", session_id="bound")
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        # (no turns: nothing due, nothing taken, but read and answered)
        rows = conn.execute(query("summary_lease_acquire_delegated"), _params(owner)).fetchall()
    assert rows == []
