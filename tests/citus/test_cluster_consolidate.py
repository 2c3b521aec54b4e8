"""Consolidation with vectors on the cluster merges what one server merges.

The same memories (the same ids, texts, dates and vectors of the hashing embedder) are
saved through the facade into a one-server database and into the distributed one; then
the same consolidations (a dry run, a run comparing every pair, a run with ``since``)
must report the same groups, matched the same way, and leave the same memories current.
On the cluster the content vectors are read by a statement of their own routed to the
tenant's shard (``harbor_pg.db.citus_rewrites``): with them in the grouping statement,
Citus refused it ("cannot push down this subquery").
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from harbor_pg.consolidation import ConsolidationReport
from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from tests.citus.conftest import ClusterDatabase
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
