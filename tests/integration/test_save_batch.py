"""save and save_many as one statement a batch (save_memories): dedup inside the batch
and against stored rows, repeated ids, both vectors of a memory with a context, all in
one round trip."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import psycopg
import pytest

from harbor_pg.db.connection import Database
from harbor_pg.embedders.base import normalize_vector
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryValidationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory, embedding_texts
from harbor_pg.tiers import long_term
from harbor_pg.tiers.long_term import PostgresLongTermStore
from tests.conftest import PgDatabase
from tests.roundtrips import RoundTripProxy

ALICE = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1")
V = [0.1] * 8
W = [0.2] * 8


async def test_one_memory_with_everything_it_can_carry(database: Database) -> None:
    """save of one memory (save_memory): every field and both vectors stored as given, a
    second save of the same content the stored memory, created false."""
    store = PostgresLongTermStore(database)
    start = datetime.now(UTC) - timedelta(days=2)
    memory = Memory(
        content="Alice moved to Lisbon",
        context="Where does Alice live now?",
        entity_ids=["alice", "lisbon"],
        source_session_id="s1",
        source_message_ids=["m1", "m2"],
        metadata={"k": [1, "two"]},
        importance=0.9,
        valid_from=start,
        expires_at=start + timedelta(days=30),
    )
    first = await store.save(ALICE, memory, V, "m8", context_embedding=W)
    assert first.created
    saved = first.memory
    assert (saved.content, saved.context, saved.entity_ids) == (
        memory.content,
        memory.context,
        ["alice", "lisbon"],
    )
    assert (saved.source_session_id, saved.source_message_ids, saved.metadata) == (
        "s1",
        ["m1", "m2"],
        {"k": [1, "two"]},
    )
    assert (saved.importance, saved.valid_from, saved.expires_at) == (
        0.9,
        start,
        start + timedelta(days=30),
    )
    async with database.transaction(ALICE) as conn:
        cur = await conn.execute(
            "select with_context, embedding::text from harbor.memory_embeddings"
            " where memory_id = %s order by with_context",
            [saved.id],
        )
        vectors = [(r["with_context"], r["embedding"]) for r in await cur.fetchall()]
    assert vectors == [
        (False, "[" + ",".join(["0.1"] * 8) + "]"),
        (True, "[" + ",".join(["0.2"] * 8) + "]"),
    ]
    again = await store.save(ALICE, Memory(content="Alice moved to Lisbon"), V, "m8")
    assert not again.created and again.memory.id == saved.id


async def test_a_duplicate_past_its_expiry_is_closed_and_the_memory_saved_afresh(
    database: Database,
) -> None:
    """One memory whose only duplicate expired while no sweep closed it: the duplicate is
    closed at its expiry and the memory saved as a new one."""
    manager = MemoryManager.from_database(database)
    start = datetime.now(UTC) - timedelta(hours=2)
    expiry = start + timedelta(hours=1)
    old = await manager.save(
        ALICE, Memory(content="Alice is in Porto", valid_from=start, expires_at=expiry)
    )
    assert old.created
    new = await manager.save(ALICE, Memory(content="Alice is in Porto"))
    assert new.created and new.memory.id != old.memory.id
    closed = await manager.get(ALICE, old.memory.id)
    assert closed is not None and closed.invalid_at == expiry


async def test_duplicates_in_the_batch_and_in_the_store(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    stored = await manager.save(ALICE, Memory(content="Alice likes tea"))
    results = await manager.save_many(
        ALICE,
        [
            Memory(content="Alice likes coffee"),
            Memory(content="Alice likes tea"),
            Memory(content="Alice likes coffee"),
            Memory(content="Alice likes cake", entity_ids=["cake"], metadata={"k": [1]}),
        ],
    )
    assert [r.created for r in results] == [True, False, False, True]
    assert results[1].memory.id == stored.memory.id
    assert results[2].memory.id == results[0].memory.id
    assert results[3].memory.entity_ids == ["cake"]
    assert results[3].memory.metadata == {"k": [1]}
    again = await manager.get(ALICE, results[3].memory.id)
    assert again is not None and again.content == "Alice likes cake"


async def test_a_repeated_id_in_one_batch(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    results = await manager.save_many(ALICE, [Memory(id="m-1", content="Alice owns a bike")] * 2)
    assert [r.created for r in results] == [True, False]
    assert {r.memory.id for r in results} == {"m-1"}


async def test_both_vectors_of_a_memory_with_a_context(
    database: Database, fresh_db: PgDatabase
) -> None:
    store = PostgresLongTermStore(database)
    results = await store.save_many(
        ALICE,
        [Memory(content="Alice moved", context="About her flat"), Memory(content="Alice ran")],
        [V, V],
        "test-model",
        context_vectors=[W, None],
    )
    assert all(r.created for r in results)
    # a duplicate gets no vector of its own
    dup = await store.save(ALICE, Memory(content="Alice ran"), W, "test-model")
    assert not dup.created
    with psycopg.connect(fresh_db.superuser_url) as conn:
        rows = conn.execute(
            "select memory_id, with_context, dims, embedding::text from harbor.memory_embeddings"
            " order by memory_id, with_context"
        ).fetchall()
    by_memory = {(r[0], r[1]): (r[2], r[3]) for r in rows}
    moved, ran = (r.memory.id for r in results)
    assert set(by_memory) == {(moved, False), (moved, True), (ran, False)}
    assert by_memory[(moved, True)][1].startswith("[0.2,")
    assert by_memory[(ran, False)] == (8, "[" + ",".join(["0.1"] * 8) + "]")


async def test_a_save_and_a_batch_are_one_round_trip_each(
    counted: tuple[Database, RoundTripProxy],
) -> None:
    db, proxy = counted
    store = PostgresLongTermStore(db)
    for i in range(7):  # past psycopg preparing the statement on its fifth use
        proxy.reset()
        await store.save(ALICE, Memory(content=f"fact {i}"), V, "test-model")
        assert proxy.flights == 1
        proxy.reset()
        batch = [Memory(content=f"batch {i} fact {k}") for k in range(5)]
        await store.save_many(ALICE, batch, [V] * 5, "test-model")
        assert proxy.flights == 1


async def test_save_and_save_many_run_the_generic_plan(
    fresh_db: PgDatabase,
) -> None:
    """A save of one memory (save_memory) runs its statement's generic plan from its
    first run on a connection (planned once, not on every call: left to choose, the
    server keeps planning it, its custom plans looking cheaper), and so does a batch
    (save_memories)."""
    db = Database(fresh_db.app_url, min_size=1, max_size=1)
    await db.open()
    try:
        store = PostgresLongTermStore(db)
        for i in range(12):
            await store.save(ALICE, Memory(content=f"fact {i}"), V, "m8")
        plans = (
            "select generic_plans, custom_plans from pg_prepared_statements"
            " where statement like %(text)s"
        )
        one = {"text": "%save_memories for one memory (save)%"}
        batch = {"text": "%Save a batch of memories with their vectors%"}
        async with db.transaction(ALICE) as conn:
            [row] = await (await conn.execute(plans, one)).fetchall()
            assert not await (await conn.execute(plans, batch)).fetchall()
        generic, custom = row["generic_plans"], row["custom_plans"]
        assert custom == 0 and generic == 12
        for i in range(8):
            await store.save_many(
                ALICE, [Memory(content=f"batch {i} {k}") for k in range(3)], [V] * 3, "m8"
            )
        async with db.transaction(ALICE) as conn:
            [row] = await (await conn.execute(plans, batch)).fetchall()
        generic_after, custom_after = row["generic_plans"], row["custom_plans"]
        # (prepared from its first run on the connection, where psycopg would wait for
        # its sixth)
        assert custom_after == 0 and generic_after == 8
    finally:
        await db.close()


async def test_the_facade_checks_an_embedders_vectors_once(
    database: Database, fresh_db: PgDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_many through the facade stores the embedder's normalised vectors (both for a
    memory with a context; in a batch of one role, and in one mixing the elevated role's
    scopes with the caller's, saved a memory at a time) without checking them a second
    time; vectors a caller gives the store are still checked."""
    checked: list[int] = []
    real = long_term.check_vector

    def counting(embedding: Sequence[float]) -> list[float]:
        checked.append(len(embedding))
        return real(embedding)

    monkeypatch.setattr(long_term, "check_vector", counting)
    embedder = HashingEmbedder(16)
    manager = MemoryManager.from_database(database, embedder=embedder)
    batches = [
        [Memory(content="Alice moved", context="About her flat"), Memory(content="Alice ran")],
        [
            Memory(content="Tea is served at four", scope="tenant", context="The office"),
            Memory(content="Alice swam"),
        ],
    ]
    for memories in batches:
        results = await manager.save_many(ALICE, memories)
        assert all(r.created for r in results)
    assert checked == []
    with psycopg.connect(fresh_db.superuser_url) as conn:
        stored = conn.execute(
            "select m.content, e.with_context, e.model_id, e.embedding::real[]::float8[]"
            " from harbor.memory_embeddings e join harbor.memories m on m.id = e.memory_id"
        ).fetchall()
    expected = []
    for m in (m for memories in batches for m in memories):
        content, with_context = embedding_texts(m)
        for flag, text in ((False, content), (True, with_context)):
            if text is not None:
                [raw] = await embedder.embed([text])
                unit = normalize_vector(raw, dimensions=16, model_id=embedder.model_id)
                as_stored = np.array(unit, dtype=np.float32).astype(float).tolist()
                expected.append((m.content, flag, embedder.model_id, as_stored))
    assert sorted(stored) == sorted(expected)
    store = PostgresLongTermStore(database)
    with pytest.raises(MemoryValidationError, match="NaN or infinity"):
        await store.save_many(ALICE, [Memory(content="x")], [[float("nan")] * 16], "m")
    assert checked == [16]


async def test_a_batchs_text_json_and_times_are_stored_as_given(database: Database) -> None:
    """The batch's text, jsonb and timestamptz arrays (sent in binary form) store every
    element as given: quotes, backslashes, braces, commas, the word NULL, an empty
    context, non-ASCII text; starts of validity all with a time zone (binary), and a
    batch mixing a naive one (read in the server's time zone, as before)."""
    store = PostgresLongTermStore(database)
    aware = datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=timezone(timedelta(hours=-7)))
    tricky = [
        'say "hi", {x}',
        "back\\slash \\\\ \\N",
        "NULL",
        "é ü 日本 \U0001f600",
        "tab\tnew\nline",
        " padded ",
    ]
    memories = [
        Memory(
            id=f"tricky-{i}",
            content=f"{text} #{i}",
            context=text if i % 2 else None,
            source_session_id=text if i % 3 == 0 else None,
            metadata={"text": text, "n": i, "nested": {"q": '"', "b": "\\"}},
            valid_from=aware + timedelta(days=i) if i % 2 else None,
        )
        for i, text in enumerate(tricky)
    ]
    saved = await store.save_many(ALICE, memories)
    for memory, result in zip(memories, saved, strict=True):
        got = result.memory
        assert (got.id, got.content, got.context, got.source_session_id, got.metadata) == (
            memory.id,
            memory.content,
            memory.context,
            memory.source_session_id,
            memory.metadata,
        )
        if memory.valid_from is not None:
            assert got.valid_from == memory.valid_from
        stored = await store.get(ALICE, memory.id or "")
        assert stored is not None and stored.content == memory.content
    naive = datetime(2024, 5, 1, 12, 30)
    mixed = [
        Memory(content="a naive start", valid_from=naive),
        Memory(content="an aware start", valid_from=aware),
    ]
    [first, second] = await store.save_many(ALICE, mixed)
    async with database.transaction(ALICE) as conn:
        row = await (
            await conn.execute("select %s::timestamp::timestamptz as t", [naive])
        ).fetchone()
    assert row is not None
    assert (first.memory.valid_from, second.memory.valid_from) == (row["t"], aware)
