"""The HNSW graph holds only the vectors of owner keys of harbor.graph_min_vectors()
vectors or more (memory_embeddings.in_graph, migration 0018); recall's dense leg
answers as if it held every row: the exact scan below its limit, and above it the
walk plus an exact scan of the caller's owner keys outside the graph.

The threshold is lowered to 120 vectors for these tests (it is a function so that
they can), and the dense leg's exact-scan limit is chosen per call (p_exact_limit),
so that both sides of both limits are a few hundred rows."""

from __future__ import annotations

import math
import random
import time
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import Memory
from harbor_pg.tiers.long_term import (
    MemoryVectors,
    PostgresLongTermStore,
    _one_params,
    memory_params,
)
from tests.conftest import PgDatabase

MIN_VECTORS = 120
BOB = MemoryOwner(tenant_id="t1", principal_id="bob")
CARA = MemoryOwner(tenant_id="t1", principal_id="cara")
DENSE = (
    "select memory_id, similarity from harbor._dense_candidates(%s::vector, 'm384', %s::"
    "harbor.memory_scope[], now(), 25, %s) order by dense_rank"
)


def _unit(rng: random.Random) -> list[float]:
    v = [rng.gauss(0, 1) for _ in range(384)]
    norm = math.sqrt(sum(x * x for x in v))
    return [x / norm for x in v]


def _literal(v: list[float]) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


@pytest.fixture
def low_threshold(fresh_db: PgDatabase) -> PgDatabase:
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        su.execute(
            "create or replace function harbor.graph_min_vectors() returns integer"
            f" language sql immutable parallel safe return {MIN_VECTORS}"
        )
    return fresh_db


class Store:
    """Memories saved through save_many with their vectors, kept to compute the exact
    answer (the nearer vector of each memory counts)."""

    def __init__(self, database: Database, rng: random.Random) -> None:
        self.store = PostgresLongTermStore(database)
        self.rng = rng
        self.vectors: dict[str, tuple[str, list[list[float]]]] = {}

    async def save(self, owner: MemoryOwner, scope: MemoryScope, n: int) -> None:
        memories = [
            Memory(
                content=f"{owner.principal_id} {scope.value} memory {len(self.vectors) + i}",
                scope=scope,
                context="the turn before" if i % 4 == 0 else None,
            )
            for i in range(n)
        ]
        vectors = [_unit(self.rng) for _ in memories]
        contexts = [_unit(self.rng) if m.context else None for m in memories]
        results = await self.store.save_many(
            owner, memories, vectors, "m384", context_vectors=contexts
        )
        for r, v, c in zip(results, vectors, contexts, strict=True):
            assert r.created
            self.vectors[str(r.memory.id)] = (scope.value, [v] + ([c] if c else []))

    def exact(self, q: list[float], scopes: set[str], mine: set[str]) -> dict[str, float]:
        near = {
            mid: self.similarity(q, mid)
            for mid, (scope, vs) in self.vectors.items()
            if scope in scopes and (scope != "user" or mid in mine)
        }
        return dict(sorted(near.items(), key=lambda kv: -kv[1])[:25])

    def similarity(self, q: list[float], mid: str) -> float:
        """The memory's nearer vector's cosine similarity to ``q`` (unit vectors)."""
        return max(sum(a * b for a, b in zip(q, v, strict=True)) for v in self.vectors[mid][1])

    def in_exact_order(self, q: list[float], got: list[str], expected: dict[str, float]) -> bool:
        """Whether ``got`` is ``expected``'s ranking: the same similarity at every
        place, to the single precision the database computes distances in (two
        memories closer than that may stand in either order)."""
        sims = [self.similarity(q, mid) for mid in got]
        return len(got) == len(expected) and all(
            abs(a - b) < 1e-6 for a, b in zip(sims, expected.values(), strict=True)
        )


def _graph_state(db: PgDatabase, user: str, scope: str) -> tuple[int, int]:
    """(vectors in the graph, vectors outside it) of one owner key."""
    with psycopg.connect(db.superuser_url) as su:
        row = su.execute(
            "select count(*) filter (where in_graph), count(*) filter (where not in_graph)"
            " from harbor.memory_embeddings where tenant_id = 't1' and scope = %s"
            " and user_id = %s",
            (scope, user),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _dense(db: PgDatabase, owner: str, q: list[float], scopes: str, limit: int) -> list[Any]:
    with psycopg.connect(db.app_url, autocommit=True) as app:
        app.execute("select harbor.set_identity('t1', principal_id => %s)", (owner,))
        return list(app.execute(DENSE, (_literal(q), scopes, limit)).fetchall())


async def test_an_owner_crossing_the_threshold_mid_stream(
    database: Database, low_threshold: PgDatabase
) -> None:
    """Below the threshold no vector is in the graph and both paths of the dense leg
    return the exact answer; the write that crosses it puts the owner's older rows in
    the graph too, later writes go straight in, and the walk then finds the exact top
    rows (allowing the graph's approximation: 23 of 25)."""
    rng = random.Random(3)
    s = Store(database, rng)
    bob: set[str] = set()
    crossed = False
    for _ in range(6):
        before = set(s.vectors)
        await s.save(BOB, MemoryScope.USER, 40)
        bob |= set(s.vectors) - before
        in_graph, outside = _graph_state(low_threshold, "bob", "user")
        total = in_graph + outside
        if total < MIN_VECTORS:
            assert in_graph == 0
        else:
            assert (in_graph, outside) == (total, 0)
            crossed = True
        for _ in range(3):
            q = _unit(rng)
            expected = s.exact(q, {"user"}, bob)
            exact = _dense(low_threshold, "bob", q, "{user}", 5000)
            walked = _dense(low_threshold, "bob", q, "{user}", 20)  # above the limit
            assert s.in_exact_order(q, [r[0] for r in exact], expected)
            for memory_id, similarity in exact + walked:
                assert similarity == pytest.approx(expected.get(memory_id, similarity), abs=1e-4)
            ids = [r[0] for r in walked]
            assert len(ids) == len(set(ids)) == 25
            if in_graph == 0:
                # all outside the graph: scanned exactly
                assert s.in_exact_order(q, ids, expected)
            else:
                assert len(set(ids) & set(expected)) >= 23
    assert crossed


async def test_a_small_user_of_a_large_tenant(
    database: Database, low_threshold: PgDatabase
) -> None:
    """TENANT rows, which every user of the tenant sees, are in the graph; a user's own
    few are not: above the exact-scan limit the walk reads the tenant's and the user's
    are scanned exactly beside it, so none of them is missed."""
    rng = random.Random(4)
    s = Store(database, rng)
    for _ in range(4):
        await s.save(BOB, MemoryScope.TENANT, 50)
    before = set(s.vectors)
    await s.save(CARA, MemoryScope.USER, 30)
    cara = set(s.vectors) - before
    assert _graph_state(low_threshold, "", "tenant")[1] == 0
    assert _graph_state(low_threshold, "cara", "user") == (0, 30 + 8)
    for _ in range(5):
        # near one of cara's memories, so that hers rank among the nearest
        target = s.vectors[rng.choice(sorted(cara))][1][0]
        q = [a + 0.5 * b for a, b in zip(target, _unit(rng), strict=True)]
        norm = math.sqrt(sum(x * x for x in q))
        q = [x / norm for x in q]
        expected = s.exact(q, {"user", "tenant"}, cara)
        walked = _dense(low_threshold, "cara", q, "{user,tenant}", 20)
        ids = [r[0] for r in walked]
        assert len(ids) == len(set(ids)) == 25
        assert {m for m in expected if m in cara} <= set(ids)
        assert len(set(ids) & set(expected)) >= 23
        exact = _dense(low_threshold, "cara", q, "{user,tenant}", 5000)
        assert s.in_exact_order(q, [r[0] for r in exact], expected)
        # bob does not see cara's rows, on either path
        for limit in (20, 5000):
            assert (
                not {r[0] for r in _dense(low_threshold, "bob", q, "{user,tenant}", limit)} & cara
            )


async def test_a_row_left_outside_the_graph_is_scanned_and_the_next_write_promotes_it(
    database: Database, low_threshold: PgDatabase
) -> None:
    """A row of a key in the graph written outside it (by a transaction that could not
    see the promotion) makes the dense leg scan that key exactly, so its answer is
    exact; the key's next write puts the row in the graph."""
    rng = random.Random(5)
    s = Store(database, rng)
    for _ in range(4):
        await s.save(BOB, MemoryScope.USER, 40)
    bob = set(s.vectors)
    assert _graph_state(low_threshold, "bob", "user")[1] == 0
    with psycopg.connect(low_threshold.superuser_url, autocommit=True) as su:
        su.execute(
            "update harbor.memory_embeddings set in_graph = false where ctid = any (array("
            "select ctid from harbor.memory_embeddings where user_id = 'bob' limit 3))"
        )
    q = _unit(rng)
    expected = s.exact(q, {"user"}, bob)
    assert s.in_exact_order(
        q, [r[0] for r in _dense(low_threshold, "bob", q, "{user}", 20)], expected
    )
    before = set(s.vectors)
    await s.save(BOB, MemoryScope.USER, 1)
    bob |= set(s.vectors) - before
    assert _graph_state(low_threshold, "bob", "user")[1] == 0


async def test_one_at_a_time_and_the_per_row_path_follow_the_key(
    database: Database, low_threshold: PgDatabase
) -> None:
    """save (one memory a call) promotes as save_many does, but counts the key's
    vectors only when the memory id is sampled (one in sixteen, by its hash): the first
    sampled save at or past the threshold puts the whole key in the graph, an unsampled
    one past it leaves the key out; insert_embedding (the per-row statement of a
    distributed database and of imports) puts a vector in the graph when its key is."""
    rng = random.Random(6)
    store = PostgresLongTermStore(database)
    ids = [f"{i:04d}-bob" for i in range(MIN_VECTORS + 200)]
    with psycopg.connect(low_threshold.superuser_url) as su:
        sampled = [
            bool(su.execute("select (hashtext(%s) & 15) = 0", (memory_id,)).fetchone()[0])  # type: ignore[index]
            for memory_id in ids
        ]
    # the save whose vector is the key's MIN_VECTORS-th, and the first sampled from it on
    crossing = MIN_VECTORS - 1
    first = next(i for i in range(crossing, len(ids)) if sampled[i])
    assert first > crossing  # (the ids are chosen so that unsampled saves come first)
    for i in range(first):
        r = await store.save(BOB, Memory(id=ids[i], content=f"bob fact {i}"), _unit(rng), "m384")
        assert r.created
    assert _graph_state(low_threshold, "bob", "user") == (0, first)
    r = await store.save(BOB, Memory(id=ids[first], content="bob fact"), _unit(rng), "m384")
    assert r.created
    assert _graph_state(low_threshold, "bob", "user") == (first + 1, 0)
    # past the threshold, in the graph: every write goes in, sampled or not
    unsampled = next(i for i in range(first + 1, len(ids)) if not sampled[i])
    r = await store.save(BOB, Memory(id=ids[unsampled], content="bob later"), _unit(rng), "m384")
    assert _graph_state(low_threshold, "bob", "user") == (first + 2, 0)
    # a key in the graph with rows left outside it (written by a transaction that could
    # not see the promotion): an unsampled save promotes them too
    with psycopg.connect(low_threshold.superuser_url, autocommit=True) as su:
        su.execute(
            "update harbor.memory_embeddings set in_graph = false where ctid = any (array("
            "select ctid from harbor.memory_embeddings where user_id = 'bob' limit 3))"
        )
    assert _graph_state(low_threshold, "bob", "user") == (first - 1, 3)
    later = next(i for i in range(unsampled + 1, len(ids)) if not sampled[i])
    r = await store.save(BOB, Memory(id=ids[later], content="bob later still"), _unit(rng), "m384")
    assert r.created
    assert _graph_state(low_threshold, "bob", "user") == (first + 3, 0)
    r = await store.save(CARA, Memory(content="cara fact"), _unit(rng), "m384")
    assert _graph_state(low_threshold, "cara", "user") == (0, 1)
    async with database.transaction(BOB) as conn:
        for i in range(2):
            memory_id, created = await store.save_in(
                conn, memory_params(BOB, Memory(content=f"bob imported {i}"))
            )
            assert created
            await store.insert_embedding(conn, "t1", memory_id, _unit(rng), "m384")
    assert _graph_state(low_threshold, "bob", "user") == (first + 5, 0)
    async with database.transaction(CARA) as conn:
        memory_id, created = await store.save_in(
            conn, memory_params(CARA, Memory(content="cara imported"))
        )
        await store.insert_embedding(conn, "t1", memory_id, _unit(rng), "m384")
    assert _graph_state(low_threshold, "cara", "user") == (0, 2)


def _another_user_of_3000(su: psycopg.Connection[Any], vector: str, *, in_graph: bool) -> None:
    """3,000 memories of another user of t1 (cara), each with ``vector`` (in the HNSW
    graph or not)."""
    su.execute(
        "insert into harbor.memories (tenant_id, scope, user_id, content, content_hash)"
        " select 't1', 'user', 'cara', 'cara ' || n, encode(sha256(convert_to("
        "'cara ' || n, 'UTF8')), 'hex') from generate_series(1, 3000) n"
    )
    su.execute(
        "insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
        " embedding, scope, user_id, in_graph) select tenant_id, id, 'm384', 384, %s::vector,"
        " scope, user_id, %s from harbor.memories where user_id = 'cara'",
        (vector, in_graph),
    )


def test_a_fresh_store_reads_only_the_keys_vectors_whatever_its_first_plans(
    fresh_db: PgDatabase,
) -> None:
    """A connection that asked where a key's vectors go while the table was empty,
    and asks again once another owner of its tenant holds thousands of vectors (no
    ANALYZE in between, autovacuum off), still reads only the key's own index
    entries: counted with the backend's own statistics for the transaction."""
    rng = random.Random(5)
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        su.execute("alter table harbor.memory_embeddings set (autovacuum_enabled = off)")
        su.execute("alter table harbor.memories set (autovacuum_enabled = off)")
    graph = "select * from harbor.vector_owner_graph('t1', 'm384', 'user', 'bob', '', '', '', 1)"
    with psycopg.connect(fresh_db.app_url) as app:
        app.execute("select harbor.set_identity('t1', principal_id => 'bob')")
        app.commit()
        for _ in range(12):  # (past the plan cache's five custom plans)
            app.execute(graph).fetchall()
        app.commit()
        with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
            _another_user_of_3000(su, _literal(_unit(rng)), in_graph=False)

        def entries_read() -> int:
            row = app.execute(
                "select coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)"
                " from pg_stat_xact_user_tables"
                " where relid = 'harbor.memory_embeddings'::regclass"
            ).fetchone()
            assert row is not None
            return int(row[0])

        before = entries_read()
        assert app.execute(graph).fetchall() == [(False, False)]
        assert entries_read() - before < 10
        app.rollback()


def test_a_save_planned_on_an_empty_store_reads_only_its_keys_vectors(
    fresh_db: PgDatabase,
) -> None:
    """save's statement (save_memory, one generic plan a connection) decides where the
    key's vectors go: planned while the table was empty, it still reads only the key's
    own index entries once another owner of the tenant holds thousands of vectors in
    the graph (no ANALYZE in between, autovacuum off). A lookup of the key written into
    the statement under the writer's policies failed this: its generic plan took the
    primary key by tenant and read every vector of the tenant."""
    rng = random.Random(7)
    with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
        su.execute("alter table harbor.memory_embeddings set (autovacuum_enabled = off)")
        su.execute("alter table harbor.memories set (autovacuum_enabled = off)")
        # ids whose hash is not sampled (a sampled one counts the key's vectors)
        ids = [
            i
            for i in (f"fresh-{n}" for n in range(64))
            if su.execute("select (hashtext(%s) & 15) <> 0", (i,)).fetchone() == (True,)
        ]
    save = query("save_memory")

    def params(n: int) -> dict[str, Any]:
        memory = Memory(id=ids[n], content=f"bob fact {n}")
        return _one_params(memory_params(BOB, memory), MemoryVectors(_unit(rng)), "m384")

    def entries_read() -> int:
        """Index entries and rows of memory_embeddings read so far, flushed statistics
        (an index-only scan reads entries without fetching a row)."""
        with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
            su.execute("set stats_fetch_consistency = none")
            row = su.execute(
                "select (select coalesce(sum(idx_tup_read), 0) from pg_stat_user_indexes"
                "         where relid = 'harbor.memory_embeddings'::regclass)"
                "       + (select coalesce(seq_tup_read, 0) from pg_stat_user_tables"
                "           where relid = 'harbor.memory_embeddings'::regclass)"
            ).fetchone()
        assert row is not None
        return int(row[0])

    def flushed(app: psycopg.Connection[Any]) -> None:
        """Commit, and wait until the backend's statistics are in shared memory."""
        app.execute("select pg_stat_force_next_flush()")
        app.commit()
        time.sleep(0.3)

    with psycopg.connect(fresh_db.app_url) as app:
        app.execute("select harbor.set_identity('t1', principal_id => 'bob')")
        app.execute("set plan_cache_mode = force_generic_plan")
        app.commit()
        for n in range(3):
            row = app.execute(save, params(n), prepare=True).fetchone()
            assert row is not None and row[1] is True  # created
            app.commit()
        with psycopg.connect(fresh_db.superuser_url, autocommit=True) as su:
            _another_user_of_3000(su, _literal(_unit(rng)), in_graph=True)
        flushed(app)
        before = entries_read()
        row = app.execute(save, params(3), prepare=True).fetchone()
        assert row is not None and row[1] is True
        flushed(app)
        assert entries_read() - before < 10
    assert _graph_state(fresh_db, "bob", "user") == (0, 4)
