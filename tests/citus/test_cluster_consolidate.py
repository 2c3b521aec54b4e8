"""Consolidation with vectors on the cluster merges what one server merges, in one call.

The same memories (the same ids, texts, dates and vectors of the hashing embedder) are
saved through the facade into a one-server database and into the distributed one; then
the same consolidations (a dry run, a run comparing every pair, a run with ``since``)
must report the same groups, matched the same way, and leave the same memories current.
On the cluster the content vectors are read by a statement of their own routed to the
tenant's shard (``harbor_pg.db.citus_rewrites``): with them in the grouping statement,
Citus refused it ("cannot push down this subquery"). The facade's consolidation is one
call that Citus delegates to the tenant's worker (harbor.consolidate_delegated,
sql/citus/consolidate.sql): one command to one node, with no BEGIN, SET LOCAL or COMMIT;
the identity it carries is checked on the worker against the caller's binding, so a bound
role that names another tenant or user is refused before anything is read or merged.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from harbor_pg.consolidation import ConsolidationReport
from harbor_pg.db.connection import Database, carried_identity
from harbor_pg.db.sqlfiles import query
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from tests.citus.conftest import ClusterDatabase
from tests.citus.delegated import HOWS, assert_refused, attacks, bound_login
from tests.citus.test_cluster_routing import _facade_commands, _queries
from tests.conftest import PgDatabase

START = datetime(2025, 3, 1, tzinfo=UTC)
ANN = MemoryOwner(tenant_id="cons-a", principal_id="ann", session_id="s1")
BEN = MemoryOwner(tenant_id="cons-b", principal_id="ben", session_id="s1")
#: groups of texts: the same once case and punctuation are set aside, near in the hashing
#: embedder's space, and apart
TEXTS = [
    "ann drinks green tea every morning",
    "Ann drinks green tea, every morning!",
    "ann drinks green tea every single morning",
    "ann's sister lives in Oslo near the harbour",
    "ann's sister lives in Oslo near the old harbour",
    "the garden shed needs a new roof before winter",
    "ann books the train to Lyon for the conference",
    "the budget review moved to thursday afternoon",
]
LATER = [
    "the budget review moved to thursday afternoon again",
    "ann books the train to Lyon for the big conference",
]


def _memories(owner: MemoryOwner, texts: list[str], first: int) -> list[Memory]:
    return [
        Memory(
            id=hashlib.sha256(f"{owner.tenant_id}/{owner.principal_id}/{k}".encode()).hexdigest()[
                :32
            ],
            content=text,
            valid_from=START + timedelta(days=k),
            importance=0.1 * ((3 * k) % 10),
        )
        for k, text in enumerate(texts, first)
    ]


async def _manager(app_url: str, admin_url: str) -> MemoryManager:
    database = Database(app_url, admin_url, min_size=1, max_size=2)
    await database.open()
    return MemoryManager.from_database(database, embedder=HashingEmbedder())


@pytest.fixture
async def managers(
    cluster_db: ClusterDatabase, fresh_db: PgDatabase
) -> AsyncIterator[tuple[MemoryManager, MemoryManager]]:
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
        conn.execute(
            "delete from harbor.memories where tenant_id = any (%s)",
            ([ANN.tenant_id, BEN.tenant_id],),
        )
    pair = (
        await _manager(fresh_db.app_url, fresh_db.admin_url),
        await _manager(cluster_db.app_url, cluster_db.admin_url),
    )
    for manager in pair:
        for owner in (ANN, BEN):
            await manager.save_many(owner, _memories(owner, TEXTS, 0))
    try:
        yield pair
    finally:
        for manager in pair:
            await manager.close()
            assert manager.database is not None
            await manager.database.close()


def _groups(report: ConsolidationReport) -> list[tuple[tuple[str, ...], str, str]]:
    return [(m.merged_ids, m.matched_by, m.content) for m in report.merges]


async def _current(manager: MemoryManager, owner: MemoryOwner) -> list[str]:
    return sorted(m.content for m in await manager.current_memories(owner))


async def test_consolidation_with_vectors_merges_what_one_server_merges(
    managers: tuple[MemoryManager, MemoryManager],
) -> None:
    one, cluster = managers
    preview = _groups(await one.consolidate(ANN, dry_run=True))
    assert {why for _ids, why, _text in preview} >= {"vector"}, preview  # (not text alone)
    assert _groups(await cluster.consolidate(ANN, dry_run=True)) == preview
    merged = _groups(await one.consolidate(ANN))
    assert merged == preview
    assert _groups(await cluster.consolidate(ANN)) == merged
    assert await _current(cluster, ANN) == await _current(one, ANN)
    # the other tenant's memories are its own, untouched by ann's consolidation
    assert await _current(cluster, BEN) == await _current(one, BEN) == sorted(TEXTS)
    # a later run comparing the memories stored since a moment with the others
    since = datetime.now(UTC)
    for manager in managers:
        await manager.save_many(ANN, _memories(ANN, LATER, len(TEXTS)))
    later = _groups(await one.consolidate(ANN, since=since))
    assert later, "the later memories match earlier ones"
    assert _groups(await cluster.consolidate(ANN, since=since)) == later
    assert await _current(cluster, ANN) == await _current(one, ANN)


def test_the_facades_consolidation_is_one_call_on_the_tenants_worker(
    cluster_db: ClusterDatabase,
) -> None:
    owner = MemoryOwner(tenant_id="cons-a", principal_id="cleo", session_id="s1")
    found: list[ConsolidationReport] = []

    async def run(manager: MemoryManager) -> None:
        await manager.save(owner, Memory(content="cleo waters the ferns"))
        await manager.save(owner, Memory(content="Cleo waters the ferns!"))
        found.append(await manager.consolidate(owner))

    sent = asyncio.run(_facade_commands(cluster_db, run))
    calls = [(to, c) for to, c in sent if "consolidate_delegated" in c]
    assert _queries(sent) == sent  # no BEGIN, SET LOCAL or COMMIT
    assert len(calls) == 1 and len(sent) == 3, sent  # (the two saves, then the call)
    [(to, command)] = calls
    assert to == cluster_db.node_of(owner.tenant_id).port
    assert re.match(r"SELECT .* FROM harbor\.consolidate_delegated\('cons-a'::text", command)
    [report] = found
    assert [m.content for m in report.merges] == ["Cleo waters the ferns!"]


ROLE = "harbor_test_consolidate_bound"
ATTACKS = attacks("cons-b")


@pytest.fixture(scope="module")
def bound_role(cluster_db: ClusterDatabase) -> Iterator[str]:
    """A login bound to tenant cons-a as user ann, with harbor_app's rights, without SET."""
    with bound_login(cluster_db, ROLE, "cons-a", "ann") as role:
        yield role


def _params(**overrides: Any) -> dict[str, Any]:
    """consolidate_delegated's parameters for ann, a dry run (``overrides``: what an
    attacker changes)."""
    return {
        **carried_identity(ANN),
        "scopes": ["user"],
        "min_similarity": None,
        "model_id": None,
        "max_merges": 1000,
        "dry_run": True,
        "since": None,
        "merged": None,
        **overrides,
    }


def test_a_bound_role_consolidates_its_own(cluster_db: ClusterDatabase, bound_role: str) -> None:
    with psycopg.connect(cluster_db.url_for(bound_role), autocommit=True) as conn:
        conn.execute(query("consolidate_delegated"), _params()).fetchall()


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.parametrize("how", HOWS)
def test_a_bound_role_naming_another_owner_in_the_call_is_refused(
    cluster_db: ClusterDatabase, bound_role: str, attack: str, how: str
) -> None:
    # what the bound role can do: call the function with any arguments, in autocommit
    # (delegated), in a transaction whose SET LOCALs name the same owner (run on the
    # coordinator), or on the named tenant's worker directly: refused before any row is
    # read or merged
    assert_refused(
        cluster_db,
        bound_role,
        query("consolidate_delegated"),
        _params(dry_run=False, **ATTACKS[attack]),
        how,
    )
