"""On the cluster, a page of a session's turns after a cursor id (PostgresShortTermStore.
after, messages_after) and the newest turns up to one (turns_through, what a queued
extraction reads) are each one call that Citus delegates to the tenant's worker
(harbor.messages_after_delegated, harbor.turns_through_delegated, sql/citus/turns.sql):
one command to one node, with no BEGIN, SET LOCAL or COMMIT, reading what the
coordinator's statement and one server's do (the caller's session's turns, not another
user's). The identity the call carries as arguments is checked on the worker against the
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
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.short_term import PostgresShortTermStore, session_key
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

TENANT = "turns-a"
ROLE = "harbor_test_turns_bound"
ANN = MemoryOwner(tenant_id=TENANT, principal_id="ann", session_id="s1")
CARL = MemoryOwner(tenant_id=TENANT, principal_id="carl", session_id="s1")


def _append(db: ClusterDatabase, owner: MemoryOwner, turns: int) -> list[int]:
    """``turns`` turns of ``owner``'s session through the facade; their ids."""

    async def run() -> list[int]:
        database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        try:
            for k in range(turns):
                await manager.append(owner, ConversationMessage(role="user", content=f"t{k}"))
            store = PostgresShortTermStore(database)
            return [int(m.id or 0) for m in await store.after(owner, 0, 1000)]
        finally:
            await manager.close()
            await database.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def turns(cluster_db: ClusterDatabase) -> list[int]:
    """The ids of ann's six turns (carl's four of the same session name beside them)."""
    _append(cluster_db, CARL, 4)
    return _append(cluster_db, ANN, 6)


#: each call's parameters, from the ids of ann's turns
def _calls(ids: list[int]) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("messages_after", {"after_id": 0, "before_id": None, "limit": 100}),
        ("messages_after", {"after_id": ids[1], "before_id": None, "limit": 2}),
        ("messages_after", {"after_id": ids[0], "before_id": ids[4], "limit": 100}),
        ("turns_through", {"message_id": ids[3], "limit": 2}),
        ("turns_through", {"message_id": ids[5], "limit": 100}),
        ("turns_through", {"message_id": 0, "limit": 100}),
    ]


def test_the_stores_reads_are_one_call_each_on_the_tenants_worker(
    cluster_db: ClusterDatabase, turns: list[int]
) -> None:
    found: list[list[int]] = []

    async def run(manager: MemoryManager) -> None:
        assert manager.database is not None
        store = PostgresShortTermStore(manager.database)
        found.append([int(m.id or 0) for m in await store.after(ANN, turns[1], 3)])
        found.append([int(m.id or 0) for m in await store.turns_through(ANN, turns[4], 2)])

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert [to for to, _c in sent] == [cluster_db.node_of(TENANT).port] * 2, sent
    assert re.match(r"SELECT .* FROM harbor\.messages_after_delegated\('turns-a'", sent[0][1])
    assert re.match(r"SELECT .* FROM harbor\.turns_through_delegated\('turns-a'", sent[1][1])
    assert found == [turns[2:5], turns[3:5]]


def test_the_delegated_calls_read_what_the_coordinators_statement_and_one_servers_do(
    cluster_db: ClusterDatabase, turns: list[int]
) -> None:
    # the delegated call in autocommit, the same function in a transaction (the
    # coordinator's statement) and one server's statement under the same identity
    expected = [
        turns,
        turns[2:4],
        turns[1:4],
        turns[2:4],
        turns,
        [],
    ]
    for (name, extra), want in zip(_calls(turns), expected, strict=True):
        params = {**carried_identity(ANN), **extra}
        with psycopg.connect(cluster_db.app_url, autocommit=True) as conn:
            delegated = conn.execute(query(f"{name}_delegated"), params).fetchall()
        with psycopg.connect(cluster_db.app_url) as conn:
            coordinated = conn.execute(query(f"{name}_delegated"), params).fetchall()
        with psycopg.connect(cluster_db.app_url) as conn:
            for setting, value in carried_identity(ANN).items():
                conn.execute(f"set local harbor.{setting} = '{value}'")
            one = conn.execute(query(name), {**session_key(ANN), **extra}).fetchall()
        assert [r[0] for r in delegated] == want, name
        assert delegated == coordinated == one, name
        assert {r[2] for r in delegated} <= {f"t{k}" for k in range(6)}


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant turns-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, TENANT, "ann") as role:
        yield role


def test_a_bound_role_reads_its_own(
    cluster_db: ClusterDatabase, bound_role: str, turns: list[int]
) -> None:
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        for name, extra in _calls(turns)[:2]:
            rows = conn.execute(
                query(f"{name}_delegated"), {**carried_identity(ANN), **extra}
            ).fetchall()
            assert rows


ATTACKS = attacks("turns-b")


@pytest.mark.parametrize("name", ["messages_after", "turns_through"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase,
    bound_role: str,
    turns: list[int],
    attack: str,
    how: str,
    name: str,
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read (carl's turns among them)
    extra = dict(_calls(turns))[name]
    assert_refused(
        cluster_db,
        bound_role,
        query(f"{name}_delegated"),
        {**carried_identity(ANN), **extra, **ATTACKS[attack]},
        how,
    )
