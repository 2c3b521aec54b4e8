"""On the cluster, a session's rolling summary is written in one call that Citus delegates
to the tenant's worker (harbor.save_summary_delegated, sql/citus/summary_write.sql): one
command to one node, with no BEGIN, SET LOCAL or COMMIT, writing what the coordinator's
statements and one server's (the guards, context_refresh_summary, context_insert_summary)
write: created once, refreshed only from the frontier its writer read, refused when the
turn it folded is gone. The identity the call carries as arguments is checked on the
worker against the caller's binding, so a bound role that names another tenant or user is
refused before anything is read or written."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import Database, carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.errors import MemoryNotFoundError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import ConversationMessage, Memory, MemoryType, content_hash
from harbor_pg.tiers.base import summary_memory_id
from harbor_pg.tiers.long_term import PostgresLongTermStore
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries

TENANT = "sumw-a"
ROLE = "harbor_test_summary_write_bound"


def _owner(user: str, session: str, tenant: str = TENANT) -> MemoryOwner:
    return MemoryOwner(tenant_id=tenant, principal_id=user, session_id=session)


def _summary(owner: MemoryOwner, text: str, frontier: int | None = None) -> Memory:
    return Memory(
        id=summary_memory_id(owner),
        scope=MemoryScope.SESSION,
        memory_type=MemoryType.SUMMARY,
        content=text,
        source="summary",
        source_message_ids=[] if frontier is None else [str(frontier)],
        metadata={} if frontier is None else {"last_covered_message_id": str(frontier)},
    )


async def _writes(db: ClusterDatabase, owner: MemoryOwner) -> list[Any]:
    """The same writes for ``owner``'s session, through the store on the cluster: created,
    refreshed from its frontier, a stale refresh, a create that finds it there, and a
    refresh whose folded turn is gone. Each outcome: the content stored, or None, or the
    error's class."""
    database = Database(db.app_url, db.admin_url, min_size=1, max_size=1)
    await database.open()
    manager = MemoryManager.from_database(database)
    store = PostgresLongTermStore(database)
    out: list[Any] = []
    try:
        turn = await manager.append(owner, ConversationMessage(role="user", content="hello"))
        assert turn.id is not None
        for summary, expected in (
            (_summary(owner, "first", int(turn.id)), None),
            (_summary(owner, "second", int(turn.id)), int(turn.id)),
            (_summary(owner, "stale", int(turn.id)), 1),
            (_summary(owner, "again"), None),
            (_summary(owner, "gone", int(turn.id) + 10**9), int(turn.id)),
        ):
            try:
                saved = await store.save_summary(owner, summary, expected_frontier=expected)
                out.append(None if saved is None else saved.content)
            except MemoryNotFoundError as exc:
                out.append(type(exc))
        stored = await store.load_summary(owner)
        out.append(None if stored is None else stored.content)
    finally:
        await manager.close()
        await database.close()
    return out


def test_the_summarys_write_is_one_call_on_the_tenants_worker(cluster_db: ClusterDatabase) -> None:
    owner = _owner("ann", "facade")
    found: list[Any] = []

    async def run(manager: MemoryManager) -> None:
        assert manager.database is not None
        store = PostgresLongTermStore(manager.database)
        summary = _summary(owner, "one")
        found.append(await store.save_summary(owner, summary, expected_frontier=None))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(sent) == 1, sent
    [(to, command)] = sent
    assert to == cluster_db.node_of(TENANT).port
    assert re.match(r"SELECT .* FROM harbor\.save_summary_delegated\('sumw-a'::text", command)
    [saved] = found
    assert saved is not None and saved.content == "one" and saved.id == summary_memory_id(owner)


def test_the_writes_answer_as_the_coordinators_statements_and_one_servers(
    cluster_db: ClusterDatabase,
) -> None:
    # the store's writes (each one delegated call), and the same function called in a
    # transaction (the coordinator's statements), give the outcomes one server's store
    # gives (tests/integration): created, refreshed from its frontier, a stale refresh
    # and a second create lost, a fold of a gone turn refused
    delegated = asyncio.run(_writes(cluster_db, _owner("ann", "delegated")))
    assert delegated == ["first", "second", None, None, MemoryNotFoundError, "second"]
    owner = _owner("ann", "coordinated")
    params = {
        **carried_identity(owner),
        "id": summary_memory_id(owner),
        "importance": 0.5,
        "content": "on the coordinator",
        "content_hash": content_hash(MemoryScope.SESSION, "on the coordinator"),
        "source_message_ids": [],
        "metadata": psycopg.types.json.Jsonb({}),
        "expected_frontier": "",
        "create": True,
        "turn_id": None,
    }
    with psycopg.connect(cluster_db.app_url) as conn:
        rows = conn.execute(query("save_summary_delegated"), params).fetchall()
    with psycopg.connect(cluster_db.app_url, autocommit=True) as conn:
        again = conn.execute(query("session_summary_delegated"), carried_identity(owner))
        stored = again.fetchall()
    assert [r[9] for r in rows] == [r[9] for r in stored] == ["on the coordinator"]
    assert rows == stored


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant sumw-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, TENANT, "ann") as role:
        yield role


def _params(owner: MemoryOwner, text: str, **overrides: Any) -> dict[str, Any]:
    return {
        **carried_identity(owner),
        "id": summary_memory_id(owner),
        "importance": 0.5,
        "content": text,
        "content_hash": content_hash(MemoryScope.SESSION, text),
        "source_message_ids": [],
        "metadata": psycopg.types.json.Jsonb({}),
        "expected_frontier": "",
        "create": True,
        "turn_id": None,
        **overrides,
    }


def test_a_bound_role_writes_its_own_summary(cluster_db: ClusterDatabase, bound_role: str) -> None:
    owner = _owner("ann", "bound")
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("save_summary_delegated"), _params(owner, "mine")).fetchall()
    assert [r[9] for r in rows] == ["mine"]


ATTACKS = attacks("sumw-b")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read or written
    assert_refused(
        cluster_db,
        bound_role,
        query("save_summary_delegated"),
        _params(_owner("ann", "attacked"), "not mine", **ATTACKS[attack]),
        how,
    )
    with psycopg.connect(cluster_db.superuser_url) as conn:
        written = conn.execute(
            "select count(*) from harbor.memories where content = 'not mine'"
        ).fetchone()
    assert written == (0,)
