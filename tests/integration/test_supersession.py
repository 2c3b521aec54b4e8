"""Supersession on the real database: one transaction, one successor under concurrency,
and the replaced fact still answerable for the time it was believed.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.rows import dict_row

from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryValidationError
from harbor_pg.extraction.extractor import MemoryExtractor
from harbor_pg.records import Memory
from harbor_pg.tiers.long_term import PostgresLongTermStore, memory_params
from tests.conftest import PgDatabase
from tests.integration.test_extraction_pg import NO_VECTOR, as_app
from tests.unit.test_extractor import (
    ALICE,
    LOGGER,
    TURN,
    ScriptedModel,
    fact,
    facts,
    replacing,
    warnings_of,
)

BERLIN = "Alice lives in Berlin."


async def berlin(store: PostgresLongTermStore) -> Memory:
    result = await store.save(ALICE, Memory(content=BERLIN, source="extracted"))
    await asyncio.sleep(0.002)
    return result.memory


def rows(db: PgDatabase) -> list[dict[str, Any]]:
    with psycopg.connect(db.superuser_url, row_factory=dict_row) as su:
        return su.execute(
            "select id, content, lower(valid) as lower, upper(valid) as upper, superseded_by,"
            " created_at, updated_at from harbor.memories order by lower(valid), content"
        ).fetchall()


async def test_close_link_and_insert_share_one_instant(
    database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresLongTermStore(database)
    old = await berlin(store)
    result = await store.supersede(ALICE, old.id or "", Memory(content="Alice lives in Rome."))
    assert result is not None and result.created
    before, after = rows(fresh_db)
    assert before["id"] == old.id and after["id"] == result.memory.id
    assert before["upper"] == after["lower"]  # closed at the successor's valid_from
    assert before["lower"] == old.valid_from and after["upper"] is None
    assert before["superseded_by"] == after["id"] and after["superseded_by"] is None
    assert before["updated_at"] == after["lower"]  # the guard stamps the change


async def test_the_old_fact_answers_for_its_time_the_new_one_for_now(
    database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresLongTermStore(database)
    old = await berlin(store)
    model = ScriptedModel(replacing(BERLIN, fact("Alice lives in Munich.")))
    (new,) = await MemoryExtractor(memories=store, model=model).extract(ALICE, TURN)
    assert old.valid_from is not None and new.valid_from is not None
    changed = new.valid_from

    async def believed(as_of: Any) -> list[str]:
        return [m.content for m in await store.search(ALICE, "Alice lives", as_of=as_of)]

    assert await believed(old.valid_from) == [BERLIN]
    assert await believed(changed - timedelta(microseconds=1)) == [BERLIN]
    assert await believed(changed) == ["Alice lives in Munich."]  # half-open: [from, to)
    assert await believed(None) == ["Alice lives in Munich."]
    assert await believed(old.valid_from - timedelta(seconds=1)) == []
    # the same through plain SQL as the application role
    with as_app(fresh_db, ALICE) as conn:
        sql = "select content from harbor.memories where valid @> %s::timestamptz"
        assert [r["content"] for r in conn.execute(sql, (old.valid_from,))] == [BERLIN]
        assert [r["content"] for r in conn.execute(sql, (changed,))] == ["Alice lives in Munich."]
    # and the old row is still readable by id, with its link
    closed = await store.get(ALICE, old.id or "")
    assert closed is not None and closed.content == BERLIN
    assert closed.superseded_by == new.id and closed.invalid_at == changed
    assert closed.is_valid_at(old.valid_from) and not closed.is_valid_at(changed)


async def test_a_waiting_superseder_finds_the_memory_already_replaced(
    database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresLongTermStore(database)
    old = await berlin(store)
    first = {
        **memory_params(ALICE, Memory(content="Alice lives in Rome.")),
        **NO_VECTOR,
        "replaces": old.id,
    }
    async with database.transaction(ALICE) as conn:
        won = await (await conn.execute(query("extraction_supersede_memory"), first)).fetchone()
        assert won is not None and won["found"] and won["id"] is not None
        # a second extractor, while the first has not committed: it must wait on the row lock
        second = asyncio.create_task(
            store.supersede(ALICE, old.id or "", Memory(content="Alice lives in Oslo."))
        )
        await asyncio.sleep(0.3)
        assert not second.done()
    assert await second is None  # re-checked after the commit: already superseded
    contents = [r["content"] for r in rows(fresh_db)]
    assert contents == [BERLIN, "Alice lives in Rome."]
    assert rows(fresh_db)[0]["superseded_by"] == won["id"]


async def test_many_concurrent_supersessions_leave_exactly_one_successor(
    database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresLongTermStore(database)
    for round_ in range(3):
        old = (await store.save(ALICE, Memory(content=f"Alice's desk is {round_}."))).memory
        await asyncio.sleep(0.002)
        results = await asyncio.gather(
            *(
                store.supersede(ALICE, old.id or "", Memory(content=f"Desk {round_} moved to {i}."))
                for i in range(8)
            )
        )
        winners = [r for r in results if r is not None]
        assert len(winners) == 1 and winners[0].created
        closed = await store.get(ALICE, old.id or "")
        assert closed is not None and closed.superseded_by == winners[0].memory.id
    with psycopg.connect(fresh_db.superuser_url) as su:
        linked = su.execute(
            "select count(*), count(distinct superseded_by) from harbor.memories"
            " where superseded_by is not null"
        ).fetchone()
        successors = su.execute("select count(*) from harbor.memories").fetchone()
    assert linked == (3, 3)
    assert successors == (6,)  # 3 replaced + 3 successors; the 21 losers wrote nothing


class AfterAllRead:
    """A model that answers only once every concurrent extractor has built its prompt."""

    supports_structured = True

    def __init__(self, model: ScriptedModel, barrier: asyncio.Barrier) -> None:
        self.model = model
        self.barrier = barrier

    async def generate_text(self, system: str, user: str) -> str:
        await self.barrier.wait()
        return await self.model.generate_text(system, user)

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        await self.barrier.wait()
        return await self.model.generate_structured(system, user, schema)


async def test_concurrent_extractors_replacing_one_memory_leave_one_successor(
    database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresLongTermStore(database)
    old = await berlin(store)
    cities = ["Munich", "Hamburg", "Vienna", "Zurich"]
    # Every extractor has read Berlin before any of them writes: the race under test is
    # four writers replacing one memory, not a late reader that no longer sees it.
    all_read = asyncio.Barrier(len(cities))
    extractors = [
        MemoryExtractor(
            memories=store,
            model=AfterAllRead(
                ScriptedModel(replacing(BERLIN, fact(f"Alice lives in {city}."))), all_read
            ),
        )
        for city in cities
    ]
    results = await asyncio.gather(*(ex.extract(ALICE, TURN) for ex in extractors))
    stored = [m for result in results for m in result]
    assert sorted(m.content for m in stored) == sorted(f"Alice lives in {c}." for c in cities)
    table = rows(fresh_db)
    (closed,) = [r for r in table if r["id"] == old.id]
    assert closed["superseded_by"] in {m.id for m in stored}
    assert sum(1 for r in table if r["superseded_by"] is not None) == 1
    assert [r["content"] for r in table if r["upper"] is None] != []
    assert all(r["upper"] is None for r in table if r["id"] != old.id)


async def test_a_failed_supersession_changes_nothing(
    database: Database, fresh_db: PgDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresLongTermStore(database)
    old = await berlin(store)
    too_long = [1.0] * 16_001  # memory_embeddings refuses it: the whole transaction rolls back
    with pytest.raises(MemoryValidationError):
        await store.supersede(
            ALICE, old.id or "", Memory(content="Alice lives in Rome."), too_long, "m"
        )
    assert [(r["content"], r["upper"], r["superseded_by"]) for r in rows(fresh_db)] == [
        (BERLIN, None, None)
    ]

    class Oversized(HashingEmbedder):
        async def embed(self, texts: Any) -> list[list[float]]:
            return [too_long for _ in texts]

    model = ScriptedModel(replacing(BERLIN, fact("Alice lives in Rome.")))
    extractor = MemoryExtractor(memories=store, model=model, embedder=Oversized())
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert await extractor.extract(ALICE, TURN) == ()
    assert any("storing fact 1 of 1" in w for w in warnings_of(caplog))
    assert [(r["content"], r["upper"]) for r in rows(fresh_db)] == [(BERLIN, None)]


async def test_a_retried_supersession_is_a_no_op(database: Database, fresh_db: PgDatabase) -> None:
    store = PostgresLongTermStore(database)
    await berlin(store)
    answer = replacing(BERLIN, fact("Alice lives in Munich."))
    first = await MemoryExtractor(memories=store, model=ScriptedModel(answer)).extract(ALICE, TURN)
    assert len(first) == 1
    # the retry's model no longer sees Berlin; it repeats the fact with a stale reference
    stale = facts(
        fact("Alice lives in Munich.", replaces=f"[{(first[0].content_hash or '')[:12]}]")
    )
    assert (
        await MemoryExtractor(memories=store, model=ScriptedModel(stale)).extract(ALICE, TURN) == ()
    )
    assert len(rows(fresh_db)) == 2


async def test_the_database_refuses_a_second_close(
    database: Database, fresh_db: PgDatabase
) -> None:
    """The backstop beneath the row lock: a closed interval cannot be changed again."""
    store = PostgresLongTermStore(database)
    old = await berlin(store)
    assert await store.supersede(ALICE, old.id or "", Memory(content="Alice lives in Rome."))
    with as_app(fresh_db, ALICE) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute(
            "update harbor.memories set valid = tstzrange(lower(valid), now()) where id = %s",
            (old.id,),
        )
