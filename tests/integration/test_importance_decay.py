"""Importance decay: recall hits counted after recall returns, and a memory's importance
in the score decaying with the time since recall last returned it.

The PostgreSQL store ranks in ``harbor.recall()`` and counts hits with
``harbor.record_hits()`` after the recall; the in-process store applies the same rules
(``harbor_pg.ranking.decayed_importance``). Both are fed the same memories.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import Database
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.ranking import decayed_importance
from harbor_pg.records import Memory
from harbor_pg.tiers.in_process import InMemoryLongTermStore
from tests.conftest import PgDatabase

NOW = datetime.now(UTC).replace(microsecond=0)
ALICE = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1")
DECAY = MemoryPolicy(importance_half_life_hours=24 * 30)


def _facts() -> list[Memory]:
    # the same words, the same importance, one valid for a year and one since yesterday
    return [
        Memory(content="The harbour ferry leaves at nine", importance=0.8,
               valid_from=NOW - timedelta(days=365)),
        Memory(content="The harbour ferry leaves at ten", importance=0.8,
               valid_from=NOW - timedelta(days=1)),
    ]  # fmt: skip


def test_decay_never_raises_an_importance() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        importance = rng.random()
        start = NOW - timedelta(hours=rng.uniform(-100, 10_000))
        recalled = rng.choice([None, NOW - timedelta(hours=rng.uniform(-100, 10_000))])
        as_of = NOW + timedelta(hours=rng.uniform(-200, 200))
        half_life = rng.choice([0.01, 1.0, 24.0, 4320.0, 1e9])
        memory = Memory(content="x", importance=importance, valid_from=start)
        weight = decayed_importance(memory, as_of, half_life, recalled)
        assert 0.0 <= weight <= importance
        assert decayed_importance(memory, as_of, None, recalled) == importance


def test_the_policy_refuses_a_half_life_that_is_not_positive() -> None:
    for bad in (0, -1, float("nan"), float("inf"), "x"):
        with pytest.raises(MemoryConfigurationError):
            MemoryPolicy(importance_half_life_hours=bad)
    assert MemoryPolicy().importance_half_life_hours is None


def _recall_sql(db: PgDatabase, half_life: float | None) -> dict[str, tuple[float, float]]:
    """harbor.recall() as Alice: each memory's (importance, score)."""
    with psycopg.connect(db.app_url) as conn:
        conn.execute("select harbor.set_identity('t1', 'p1', 'alice', null, 's1', null, true)")
        rows: list[Any] = conn.execute(
            "select id, importance, score from harbor.recall('harbour ferry leaves',"
            " top_k => 10, importance_half_life_hours => %s)",
            (half_life,),
        ).fetchall()
    return {r[0]: (float(r[1]), float(r[2])) for r in rows}


async def test_sql_decay_lowers_scores_and_never_raises_them(
    database: Database, fresh_db: PgDatabase
) -> None:
    manager = MemoryManager.from_database(database)
    saved = await manager.save_many(ALICE, _facts())
    old, new = (s.memory.id for s in saved)
    plain = _recall_sql(fresh_db, None)
    for half_life in (1.0, 24.0 * 30, 24.0 * 3650):
        decayed = _recall_sql(fresh_db, half_life)
        assert decayed.keys() == plain.keys() == {old, new}
        for memory_id, (importance, score) in decayed.items():
            assert importance == plain[memory_id][0]  # the stored importance, unchanged
            assert score <= plain[memory_id][1]
        assert decayed[old][1] < decayed[new][1]  # a year unrecalled weighs less
    with (
        psycopg.connect(fresh_db.app_url) as conn,
        pytest.raises(psycopg.errors.InvalidParameterValue),
    ):
        conn.execute("select harbor.set_identity('t1', principal_id => 'alice', is_local => true)")
        conn.execute("select * from harbor.recall('ferry', importance_half_life_hours => 0)")


def _hits(db: PgDatabase) -> dict[str, tuple[int, datetime]]:
    with psycopg.connect(db.superuser_url) as conn:
        rows = conn.execute(
            "select memory_id, hits, last_recalled_at from harbor.memory_hits"
        ).fetchall()
    return {r[0]: (r[1], r[2]) for r in rows}


async def test_recall_counts_its_hits_afterwards_only_with_decay_on(
    database: Database, fresh_db: PgDatabase
) -> None:
    plain = MemoryManager.from_database(database)
    saved = await plain.save_many(ALICE, _facts())
    old, new = (s.memory.id for s in saved)
    await plain.recall(ALICE, "harbour ferry")
    await plain.drain()
    assert _hits(fresh_db) == {}  # the default policy writes nothing
    before = _recall_sql(fresh_db, 24.0 * 30)
    manager = MemoryManager.from_database(database, policy=DECAY)
    assert [m.id for m in await manager.recall(ALICE, "harbour ferry")] == [new, old]
    await manager.drain()
    first = _hits(fresh_db)
    assert {k: v[0] for k, v in first.items()} == {old: 1, new: 1}
    await manager.recall(ALICE, "harbour ferry")
    await manager.drain()
    second = _hits(fresh_db)
    assert {k: v[0] for k, v in second.items()} == {old: 2, new: 2}
    assert second[old][1] >= first[old][1]
    # a memory just recalled has decayed less than before its hits
    after = _recall_sql(fresh_db, 24.0 * 30)
    assert after[old][1] > before[old][1] and after[new][1] >= before[new][1]
    # deleting a memory takes its hits
    assert await manager.delete(ALICE, old)
    assert set(_hits(fresh_db)) == {new}


async def test_the_in_process_store_decays_and_counts_as_sql_does() -> None:
    store = InMemoryLongTermStore()
    manager = MemoryManager(long_term=store, policy=DECAY)
    saved = await manager.save_many(ALICE, _facts())
    old, new = (s.memory.id or "" for s in saved)
    assert [m.id for m in await manager.recall(ALICE, "harbour ferry")] == [new, old]
    assert (store.recall_hits(old), store.recall_hits(new)) == (1, 1)
    last = store.last_recalled(old)
    assert last is not None and last >= NOW
    await manager.recall(ALICE, "harbour ferry")
    assert store.recall_hits(old) == 2
    plain = MemoryManager(long_term=InMemoryLongTermStore())
    await plain.save_many(ALICE, _facts())
    await plain.recall(ALICE, "harbour ferry")
    assert isinstance(plain.long_term, InMemoryLongTermStore)
    assert all(plain.long_term.recall_hits(i) == 0 for i in (old, new))


@pytest.mark.parametrize("store", ["postgres", "in_process"])
async def test_the_profile_puts_the_more_often_recalled_first_among_equals(
    database: Database, store: str
) -> None:
    manager = (
        MemoryManager.from_database(database, policy=DECAY)
        if store == "postgres"
        else MemoryManager(long_term=InMemoryLongTermStore(), policy=DECAY)
    )
    # equally important, both held long: the longer held first, until the other is
    # recalled more often
    older, newer = await manager.save_many(
        ALICE,
        [
            Memory(content="Alice rows on the harbour", valid_from=NOW - timedelta(days=90)),
            Memory(content="Alice sails on weekends", valid_from=NOW - timedelta(days=60)),
        ],
    )
    ids = [older.memory.id, newer.memory.id]
    assert [m.id for m in (await manager.profile(ALICE, token_budget=None)).memories] == ids
    for _ in range(2):
        assert [m.id for m in await manager.recall(ALICE, "sails weekends", top_k=1)] == ids[1:]
        await manager.drain()
    profile = await manager.profile(ALICE, token_budget=None)
    assert [e.memory.id for e in profile.stable] == ids[::-1]
