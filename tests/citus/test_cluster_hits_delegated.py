"""On the cluster, a recall's hits (importance decay: PostgresLongTermStore.record_hits,
after the recall returned) are counted in one call that Citus delegates to the tenant's
worker (harbor.record_hits_delegated, sql/citus/hits.sql): one command to one node, with
no BEGIN, SET LOCAL or COMMIT, counting what one server's harbor.record_hits() counts (the
memories the caller can see, once a call; a GLOBAL memory too, in the coordinator's
transaction after the call, whose shard may be another worker's). The identity the call
carries as arguments is checked on the worker against the caller's binding, so a bound
role that names another tenant or user is refused before anything is read or written.

Every row these tests count is created through the application role, the rights the
bound role has (the facade's pools cannot log in as the bound role, which may not SET ROLE
harbor_app); the superuser only reads the counts back (and, for the GLOBAL case, the
elevated role saves the GLOBAL memory)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

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
from tests.conftest import PgDatabase

ANN = MemoryOwner(tenant_id="hits-a", principal_id="ann", session_id="s1")
CARL = MemoryOwner(tenant_id="hits-a", principal_id="carl", session_id="s1")
BOB = MemoryOwner(tenant_id="hits-b", principal_id="bob", session_id="s1")
ROLE = "harbor_test_hits_bound"

T = TypeVar("T")


def _with_store(
    app_url: str,
    admin_url: str,
    run: Callable[[MemoryManager, PostgresLongTermStore], Awaitable[T]],
) -> T:
    """``run`` with a facade (and its long-term store) on ``app_url`` / ``admin_url``."""

    async def go() -> T:
        database = Database(app_url, admin_url, min_size=1, max_size=1)
        await database.open()
        manager = MemoryManager.from_database(database)
        try:
            assert isinstance(manager.long_term, PostgresLongTermStore)
            return await run(manager, manager.long_term)
        finally:
            await manager.close()
            await database.close()

    return asyncio.run(go())


def _save(app_url: str, admin_url: str, owner: MemoryOwner, *texts: str) -> list[str]:
    """``texts`` saved as ``owner``'s user memories through the facade."""

    async def run(m: MemoryManager, _store: PostgresLongTermStore) -> list[str]:
        return [
            (await m.save(owner, Memory(content=t, scope=MemoryScope.USER))).memory.id or ""
            for t in texts
        ]

    return _with_store(app_url, admin_url, run)


def _record(app_url: str, admin_url: str, owner: MemoryOwner, ids: list[str]) -> int:
    """The facade's hit write as ``owner`` for ``ids``: how many it counted."""

    async def run(_m: MemoryManager, store: PostgresLongTermStore) -> int:
        return await store.record_hits(owner, ids)

    return _with_store(app_url, admin_url, run)


def _hits(superuser_url: str, *ids: str) -> dict[str, tuple[int, Any]]:
    """memory id -> (hits, last_recalled_at) of each of ``ids`` that has a hit row."""
    with psycopg.connect(superuser_url) as conn:
        rows = conn.execute(
            "select memory_id, hits, last_recalled_at from harbor.memory_hits"
            " where memory_id = any (%s)",
            (list(ids),),
        ).fetchall()
    return {memory_id: (hits, at) for memory_id, hits, at in rows}


def _params(owner: MemoryOwner, ids: list[str], **overrides: Any) -> dict[str, Any]:
    """record_hits_delegated's parameters (``overrides``: what an attacker changes)."""
    return {**carried_identity(owner), "ids": ids, **overrides}


def test_the_facades_hit_write_is_one_call_on_the_tenants_worker(
    cluster_db: ClusterDatabase,
) -> None:
    ids = _save(cluster_db.app_url, cluster_db.admin_url, ANN, "ann: hit once", "ann: hit too")
    counted: list[int] = []

    async def run(manager: MemoryManager) -> None:
        assert manager.database is not None
        counted.append(await PostgresLongTermStore(manager.database).record_hits(ANN, ids))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert _queries(sent) == sent, sent  # no BEGIN, SET LOCAL or COMMIT
    assert [to for to, _c in sent] == [cluster_db.node_of("hits-a").port], sent
    assert re.match(r"SELECT .* FROM harbor\.record_hits_delegated\('hits-a'::text", sent[0][1])
    assert counted == [2]
    assert {i: h for i, (h, _at) in _hits(cluster_db.superuser_url, *ids).items()} == {
        ids[0]: 1,
        ids[1]: 1,
    }


def _counts(app_url: str, admin_url: str, superuser_url: str) -> tuple[list[int], list[Any]]:
    """The same hit writes through the facade: what each counted, and the hit rows
    (content, user, hits) they left."""
    ann = _save(app_url, admin_url, ANN, "ann: the same counts", "ann: and another")
    [carls] = _save(app_url, admin_url, CARL, "carl: not ann's to count")
    counted = [
        # (an id twice, another user's memory, an id not stored: counted once, not, not)
        _record(app_url, admin_url, ANN, [*ann, ann[0], carls, "no-such-id"]),
        _record(app_url, admin_url, ANN, [ann[1]]),
        _record(app_url, admin_url, CARL, [carls, *ann]),
        _record(app_url, admin_url, ANN, []),
    ]
    with psycopg.connect(superuser_url) as conn:
        rows = conn.execute(
            "select m.content, h.user_id, h.hits from harbor.memory_hits h"
            " join harbor.memories m on m.tenant_id = h.tenant_id and m.id = h.memory_id"
            " where h.memory_id = any (%s) order by m.content",
            ([*ann, carls],),
        ).fetchall()
    return counted, rows


def test_the_hit_counts_are_one_servers(cluster_db: ClusterDatabase, fresh_db: PgDatabase) -> None:
    one_server = _counts(fresh_db.app_url, fresh_db.admin_url, fresh_db.superuser_url)
    assert one_server == (
        [2, 1, 1, 0],
        [
            ("ann: and another", "ann", 2),
            ("ann: the same counts", "ann", 1),
            ("carl: not ann's to count", "carl", 1),
        ],
    )
    assert _counts(cluster_db.app_url, cluster_db.admin_url, cluster_db.superuser_url) == (
        one_server
    )


def test_a_global_memorys_hit_is_counted_after_the_call(cluster_db: ClusterDatabase) -> None:
    # a GLOBAL memory (tenant '', saved by the elevated role, which sets the flag that they
    # may exist): the call counts the tenant's and names the global one uncounted; the
    # facade counts it in the coordinator's transaction, as one server's function does
    [mine] = _save(cluster_db.app_url, cluster_db.admin_url, ANN, "ann: beside a global one")

    async def save_global(m: MemoryManager, _store: PostgresLongTermStore) -> str:
        memory = Memory(content="everyone: hits are counted", scope=MemoryScope.GLOBAL)
        return (await m.save(ANN, memory)).memory.id or ""

    shared = _with_store(cluster_db.app_url, cluster_db.admin_url, save_global)
    with psycopg.connect(cluster_db.app_url, autocommit=True) as conn:
        rows = conn.execute(query("record_hits_delegated"), _params(ANN, [mine, shared]))
        assert rows.fetchall() == [(1, [shared])]
    counted: list[int] = []

    async def run(manager: MemoryManager) -> None:
        assert manager.database is not None
        store = PostgresLongTermStore(manager.database)
        counted.append(await store.record_hits(ANN, [mine, shared]))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    assert counted == [2]
    # the call to the tenant's worker, then the coordinator's transaction, which reaches
    # the '' shard's node
    (to, call), *rest = sent
    assert to == cluster_db.node_of("hits-a").port
    assert re.match(r"SELECT .* FROM harbor\.record_hits_delegated\('hits-a'::text", call)
    assert _queries(rest) != rest, sent  # a transaction
    assert cluster_db.node_of("").port in {p for p, _c in _queries(rest)}, sent
    counts = _hits(cluster_db.superuser_url, mine, shared)
    assert {i: h for i, (h, _at) in counts.items()} == {mine: 2, shared: 1}


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant hits-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, "hits-a", "ann") as role:
        yield role


def test_a_bound_role_counts_its_own(cluster_db: ClusterDatabase, bound_role: str) -> None:
    # ann's memory saved through the facade (the application role), counted by the bound role
    [memory_id] = _save(cluster_db.app_url, cluster_db.admin_url, ANN, "ann: the bound role's")
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        rows = conn.execute(query("record_hits_delegated"), _params(ANN, [memory_id]))
        assert rows.fetchall() == [(1, [])]
    assert _hits(cluster_db.superuser_url, memory_id)[memory_id][0] == 1


ATTACKS = attacks("hits-b")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # carl's (ann's tenant) and bob's (another tenant) memories, each counted once by its
    # owner through the application role; the bound role (ann) calls the function naming
    # another owner, in autocommit (delegated), in a transaction whose SET LOCALs name the
    # same owner (run on the coordinator), or on the named tenant's worker directly:
    # refused before any row is read, and their counts are what their owners left
    app, admin = cluster_db.app_url, cluster_db.admin_url
    [carls] = _save(app, admin, CARL, f"carl: attacked {attack} {how}")
    [bobs] = _save(app, admin, BOB, f"bob: attacked {attack} {how}")
    assert _record(app, admin, CARL, [carls]) == 1
    assert _record(app, admin, BOB, [bobs]) == 1
    before = _hits(cluster_db.superuser_url, carls, bobs)
    assert sorted(h for h, _at in before.values()) == [1, 1]
    assert_refused(
        cluster_db,
        bound_role,
        query("record_hits_delegated"),
        _params(ANN, [carls, bobs], **ATTACKS[attack]),
        how,
    )
    assert _hits(cluster_db.superuser_url, carls, bobs) == before
