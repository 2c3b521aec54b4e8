"""The same calls answer the same rows on one server and on the cluster.

The same memories (the same ids, texts, dates and vectors) are written through the
facade into a one-server database and into the distributed one, for two owners of
one tenant and one of another; then each read of the facade is asked the same
question on both and must return the same memories in the same order: recall
(hybrid, lexical alone, dense alone, with the substring fallback), search, the
current memories and, after the same turns are appended, the recent turns.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import Database, local_identity
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory
from tests.citus.conftest import ClusterDatabase
from tests.conftest import PgDatabase

START = datetime(2025, 3, 1, tzinfo=UTC)
ASOF = START + timedelta(days=40)
TOPICS = ["garden", "budget", "trip", "dinner", "concert", "hiking", "paint", "job"]
OWNERS = [
    MemoryOwner(tenant_id="same-a", principal_id="ann", session_id="s1"),
    MemoryOwner(tenant_id="same-a", principal_id="ben", session_id="s1"),
    MemoryOwner(tenant_id="same-b", principal_id="cat", session_id="s1"),
]
QUESTIONS = [
    "what did Ann say about the garden?",
    "budget for the trip",
    "concert tickets and dinner",
    "hiking",
    "a question about nothing stored here",
    "turn 17",
]


def _memories(owner: MemoryOwner) -> list[Memory]:
    """Forty memories of the owner, dated a day apart, each with its previous one as
    its context (two vectors each)."""
    out: list[Memory] = []
    previous: str | None = None
    for k in range(40):
        content = (
            f"{owner.principal_id}: turn {k} about the {TOPICS[k % 8]}"
            f" and the {TOPICS[(3 * k) % 8]} ({k % 7})"
        )
        key = f"{owner.tenant_id}/{owner.principal_id}/{k}"
        out.append(
            Memory(
                id=hashlib.sha256(key.encode()).hexdigest()[:32],
                content=content,
                context=previous,
                valid_from=START + timedelta(days=k),
                importance=0.1 * (k % 10),
            )
        )
        previous = content
    return out


async def _manager(app_url: str, admin_url: str) -> MemoryManager:
    database = Database(app_url, admin_url, min_size=1, max_size=2)
    await database.open()
    return MemoryManager.from_database(database, embedder=HashingEmbedder())


@pytest.fixture
async def managers(
    cluster_db: ClusterDatabase, fresh_db: PgDatabase
) -> AsyncIterator[tuple[MemoryManager, MemoryManager]]:
    with psycopg.connect(cluster_db.superuser_url, autocommit=True) as conn:
        for table in ("harbor.memories", "harbor.messages", "harbor.owner_locks"):
            conn.execute(
                f"delete from {table} where tenant_id = any (%s)",
                (sorted({o.tenant_id for o in OWNERS}),),
            )
    pair = (
        await _manager(fresh_db.app_url, fresh_db.admin_url),
        await _manager(cluster_db.app_url, cluster_db.admin_url),
    )
    for manager in pair:
        for owner in OWNERS:
            await manager.save_many(owner, _memories(owner))
    try:
        yield pair
    finally:
        for manager in pair:
            await manager.close()
            assert manager.database is not None
            await manager.database.close()


def _ids(memories: object) -> list[str | None]:
    return [m.id for m in memories]  # type: ignore[attr-defined]


async def test_recall_and_search_answer_the_same_rows(
    managers: tuple[MemoryManager, MemoryManager],
) -> None:
    one, cluster = managers
    for owner in OWNERS:
        for question in QUESTIONS:
            a = await one.recall(owner, question, as_of=ASOF, top_k=15, token_budget=10**6)
            b = await cluster.recall(owner, question, as_of=ASOF, top_k=15, token_budget=10**6)
            assert _ids(a) == _ids(b), (owner, question)
            a_search = await one.search(owner, question, limit=15, as_of=ASOF)
            b_search = await cluster.search(owner, question, limit=15, as_of=ASOF)
            assert _ids(a_search) == _ids(b_search), (owner, question)
        assert _ids(await one.current_memories(owner)) == _ids(
            await cluster.current_memories(owner)
        )
    # something was found: the comparison is not of two empty lists
    assert await one.recall(OWNERS[0], QUESTIONS[1], as_of=ASOF, top_k=15)


async def test_the_recent_turns_are_the_same(
    managers: tuple[MemoryManager, MemoryManager],
) -> None:
    one, cluster = managers
    for manager in (one, cluster):
        for owner in OWNERS:
            for k in range(6):
                await manager.append(
                    owner, ConversationMessage(role="user", content=f"turn {k} of {owner}")
                )
    for owner in OWNERS:
        a = [m.content for m in await one.recent(owner)]
        b = [m.content for m in await cluster.recent(owner)]
        assert a == b
        assert len(a) == 6


def _recall_rows(url: str, owner: MemoryOwner, question: str) -> list[tuple[Any, ...]]:
    """Every signal of recall's rows and their columns (not the two databases' write
    times), with the importance decay (the hits read back)."""
    with psycopg.connect(url) as conn:
        for command in local_identity(owner):
            conn.execute(command)
        return conn.execute(
            "select id, rank, substring_match, relevance, neighbour, date_match, recency,"
            " score, tokens, content, content_hash, scope, memory_type, importance,"
            " entity_ids, sensitivity, valid_from, invalid_at, context, metadata, expires_at,"
            " source_message_ids from harbor.recall(%s, as_of => %s, top_k => 15,"
            " importance_half_life_hours => 240)",
            (question, ASOF),
        ).fetchall()


async def test_recall_signals_are_the_same_with_hits_and_the_substring_fallback(
    managers: tuple[MemoryManager, MemoryManager], cluster_db: ClusterDatabase, fresh_db: PgDatabase
) -> None:
    # the cluster ranks in a statement of its own and reads the hits apart
    # (harbor_pg.db.citus_rewrites), the fallback's rows carrying their context keys:
    # the same scores, neighbours and decay. A memory recalled after ASOF is not decayed
    # at ASOF; the others are
    owner = OWNERS[0]
    for url in (fresh_db.app_url, cluster_db.app_url):
        with psycopg.connect(url) as conn:
            for command in local_identity(owner):
                conn.execute(command)
            conn.execute(
                "select harbor.record_hits(array(select id from harbor.recall('garden',"
                " as_of => %s, top_k => 3)))",
                (ASOF,),
            )
    for question in ("garden budget", "nn: tur", "a question about nothing"):
        a = _recall_rows(fresh_db.app_url, owner, question)
        assert a == _recall_rows(cluster_db.app_url, owner, question), question
    # (no word of "nn: tur" matches: the fallback answered, its rows neighbours)
    fallback = _recall_rows(fresh_db.app_url, owner, "nn: tur")
    assert fallback and all(row[2] for row in fallback)
    assert any(row[4] > 0 for row in fallback)
