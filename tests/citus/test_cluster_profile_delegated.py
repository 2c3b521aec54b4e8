"""On the cluster, the facade reads a user's profile in one call that Citus delegates to
the tenant's worker (harbor.profile_delegated, sql/citus/profile.sql): one command to one
node, with no BEGIN, SET LOCAL or COMMIT, answering as the coordinator's statement and one
server's profile do; on the worker it runs the profile's twin over the tenant's shard
tables, reaching no shard through Citus. The identity the call carries as arguments is
checked on the worker against the caller's binding, so a bound role that names another
tenant or user is refused before anything is read."""

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
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.profile import ProfileRequest
from harbor_pg.records import Memory
from harbor_pg.tiers.rows import profile_params
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

ANN = MemoryOwner(tenant_id="profile-a", principal_id="ann", session_id="s1")
CARL = MemoryOwner(tenant_id="profile-a", principal_id="carl", session_id="s1")
BOB = MemoryOwner(tenant_id="profile-b", principal_id="bob", session_id="s1")
ROLE = "harbor_test_profile_bound"
NOW = datetime.now(UTC)
#: ann's memories: (text, days held, importance)
ANNS = [
    ("ann: lives in Oslo", 400, 0.9),
    ("ann: works as a nurse", 200, 0.5),
    ("ann: allergic to nuts", 90, 0.95),
    ("ann: started a pottery class", 3, 0.4),
    ("ann: planning a trip to Lyon", 1, 0.7),
]


@pytest.fixture(scope="module")
def stored(cluster_db: ClusterDatabase) -> ClusterDatabase:
    # each owner's memories saved through the facade as the application role
    async def write() -> None:
        db = Database(cluster_db.app_url, cluster_db.admin_url, min_size=1, max_size=1)
        await db.open()
        manager = MemoryManager.from_database(db)
        try:
            for text, days, importance in ANNS:
                memory = Memory(
                    content=text, valid_from=NOW - timedelta(days=days), importance=importance
                )
                await manager.save(ANN, memory)
            await manager.save(ANN, Memory(content="ann: s1's note", scope=MemoryScope.SESSION))
            await manager.save(CARL, Memory(content="carl: his own"))
            await manager.save(BOB, Memory(content="bob: another tenant's"))
        finally:
            await manager.close()
            await db.close()

    asyncio.run(write())
    return cluster_db


def _params(owner: MemoryOwner, budget: int | None = None, **overrides: Any) -> dict[str, Any]:
    """profile_delegated's parameters for ``owner`` (``overrides``: what an attacker
    changes)."""
    request = ProfileRequest(scopes=(MemoryScope.USER,), token_budget=budget)
    return {
        **profile_params(request, [MemoryScope.USER]),
        **carried_identity(owner),
        **overrides,
    }


def test_the_facades_profile_is_one_call_on_the_tenants_worker(stored: ClusterDatabase) -> None:
    found: list[Any] = []

    async def run(manager: MemoryManager) -> None:
        found.append(await manager.profile(ANN, token_budget=None))

    sent = asyncio.run(_facade_commands(stored, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == stored.node_of(ANN.tenant_id).port
    assert re.match(r"SELECT .* FROM harbor\.profile_delegated\('profile-a'::text", command)
    [profile] = found
    assert [e.memory.content for e in profile.stable] == [
        "ann: allergic to nuts",
        "ann: lives in Oslo",
        "ann: works as a nurse",
    ]
    assert [e.memory.content for e in profile.recent] == [
        "ann: planning a trip to Lyon",
        "ann: started a pottery class",
    ]


@pytest.mark.parametrize("budget", [None, 30], ids=["no budget", "30 tokens"])
def test_the_delegated_call_answers_as_the_coordinators_statement_and_one_servers(
    stored: ClusterDatabase, budget: int | None
) -> None:
    # from the delegated call in autocommit (the profile's twin on the worker, twice: the
    # second uses the twins the first made), from the same function in a transaction (the
    # coordinator's harbor.profile()), and one server's profile under the same identity
    params = _params(ANN, budget)
    with psycopg.connect(stored.app_url, autocommit=True) as conn:
        delegated = conn.execute(query("profile_delegated"), params).fetchall()
        again = conn.execute(query("profile_delegated"), params).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        coordinated = conn.execute(query("profile_delegated"), params).fetchall()
    with psycopg.connect(stored.app_url) as conn:
        for setting, value in carried_identity(ANN).items():
            conn.execute(f"set local harbor.{setting} = '{value}'")
        one_server = conn.execute(query("profile"), params).fetchall()
    assert delegated == again == coordinated == one_server
    assert len(delegated) == 5 if budget is None else 0 < len(delegated) < 5
    assert {r[11] for r in delegated} <= {text for text, _days, _importance in ANNS}


def test_on_the_worker_the_profile_reads_its_tenants_shard_tables_alone(
    stored: ClusterDatabase,
) -> None:
    # no statement of the delegated profile is sent over a connection, nor run through
    # Citus's local execution: its twin reads the shard tables themselves
    node = stored.node_of(ANN.tenant_id)
    index = [w.port for w in stored.cluster.workers].index(node.port)
    url = psycopg.conninfo.make_conninfo(
        stored.worker_url(index, "harbor_app"), options="-c citus.log_remote_commands=on"
    )
    notes: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
        rows = conn.execute(query("profile_delegated"), _params(ANN)).fetchall()
    assert len(rows) == 5
    assert notes == []


@pytest.fixture(scope="module")
def bound_role(stored: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant profile-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(stored, ROLE, "profile-a", "ann") as role:
        yield role


def test_a_bound_role_reads_its_own_profile(stored: ClusterDatabase, bound_role: str) -> None:
    with psycopg.connect(stored.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("profile_delegated"), _params(ANN)).fetchall()
    assert sorted(r[11] for r in rows) == sorted(text for text, _days, _importance in ANNS)


ATTACKS = attacks("profile-b")


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
        stored, bound_role, query("profile_delegated"), _params(ANN, **ATTACKS[attack]), how
    )
