"""Database work per extracted fact, on the embedded server with 100,000 memories.

    python -m benchmarks extraction [--memories 100000] [--users 10000] [--calls 1000]
                                    [--shared-buffers 1GB] [--synchronous-commit off]
                                    [--explain]

Builds USER memories server-side with generate_series (as the superuser), each
with a 384-dimension vector in ``harbor.memory_embeddings`` (the HNSW index is
dropped for the bulk load and rebuilt, as a restore would), then runs
``MemoryExtractor.extract`` as the application role (row-level security on,
identity set per transaction) on random owners. Each call's scripted model
proposes three facts, so every call exercises the three paths a fact can take:

  * new:         similarity gate (exact cosine over the owner's vectors, in SQL), then
                 insert of the memory and its vector (exclusion constraint = hash gate);
  * restatement: similarity gate only (the same words as the first fact: skipped);
  * supersede:   similarity gate, then one transaction that locks the memory the model
                 named, inserts the successor and its vector, and closes the old interval.

Model time is excluded: the model is scripted (no network, microseconds) and
the embedder returns precomputed vectors. The per-fact figure is the time of
the one store call each fact makes, ``add_fact`` (one transaction: identity,
similarity gate, write, commit); the per-call figure is the whole ``extract()``
including the query that loads the memories shown to the model.

The embedded server runs with PostgreSQL's default settings (shared_buffers
128MB, synchronous commit). With 100,000 vectors the HNSW index is about 200 MB,
so every vector insert reads index pages from outside shared buffers;
``--shared-buffers 1GB`` restarts the server with room for it and prewarms the
tables and indexes before measuring. ``--synchronous-commit off`` sets it for
the application role, to show what the WAL flush at each commit costs (an
experiment only: harbor-pg does not turn durability off).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    latency_row,
    machine,
    private_server,
    record,
    restart_with,
    summary_ms,
    with_params,
)

from harbor_pg.db import migrate, server
from harbor_pg.db.connection import Database, identity_params
from harbor_pg.db.sqlfiles import query
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.extraction.extractor import MemoryExtractor
from harbor_pg.extraction.facts import CHAT_SCOPES
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.tiers.base import FactResult
from harbor_pg.tiers.long_term import PostgresLongTermStore, current_memories_params, vector_literal

TENANTS = 100
DIMS = 384
HASHING = HashingEmbedder(DIMS)
MODEL_ID = HASHING.model_id
T = TypeVar("T", bound=BaseModel)


def build(su: str, memories: int, users: int) -> None:
    url = with_params(su, dbname="harbor")
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(
            """
            insert into harbor.memories (tenant_id, scope, user_id, principal_id, content,
                                         content_hash, importance, source)
            select 't' || (u %% %(tenants)s), 'user', 'u' || u, 'u' || u,
                   'note ' || n || ' of user ' || u || ': ' || md5(n::text),
                   md5(n::text) || md5((n + 1)::text), (n %% 10) / 10.0, 'extracted'
              from (select n, n %% %(users)s + 1 as u from generate_series(1, %(n)s) n) g
            """,
            {"tenants": TENANTS, "users": users, "n": memories},
        )
        t1 = time.perf_counter()
        print(f"built {memories:,} memories in {t1 - t0:.1f}s", flush=True)
        index = c.execute(
            "select indexdef from pg_indexes where indexname = 'memory_embeddings_hnsw_384'"
        ).fetchone()
        assert index is not None
        c.execute("drop index harbor.memory_embeddings_hnsw_384")
        c.execute(
            """
            insert into harbor.memory_embeddings (tenant_id, memory_id, model_id, dims, embedding,
                                                  scope, project_id, user_id, session_id, run_id)
            select m.tenant_id, m.id, %(model_id)s, %(dims)s,
                   (select array_agg(random() - 0.5)
                      from generate_series(1, %(dims)s + 0 * length(m.id)))::public.vector,
                   m.scope, m.project_id, m.user_id, m.session_id, m.run_id
              from harbor.memories m
            """,
            {"model_id": MODEL_ID, "dims": DIMS},
        )
        t2 = time.perf_counter()
        print(f"built {memories:,} vectors in {t2 - t1:.1f}s", flush=True)
        c.execute("set maintenance_work_mem = '1GB'")
        c.execute(index[0])
        print(f"rebuilt the HNSW index in {time.perf_counter() - t2:.1f}s", flush=True)
        c.execute("vacuum analyze harbor.memories")
        c.execute("vacuum analyze harbor.memory_embeddings")


class ThreeFacts:
    """A scripted MemoryModel: a new fact, its restatement, and a supersession."""

    supports_structured = True

    def __init__(self) -> None:
        self.n = 0

    async def generate_text(self, system: str, user: str) -> str:
        raise AssertionError("structured output is used")

    async def generate_structured(self, system: str, user: str, schema: type[T]) -> T:
        self.n += 1
        first_ref = next(
            (line.split("]", 1)[0] + "]" for line in user.splitlines() if line.startswith("[")),
            None,
        )
        new = f"The user booked trip number {self.n} to Lisbon for the budget review."
        return schema.model_validate(
            {
                "facts": [
                    {"content": new, "scope": "user", "importance": 0.8},
                    {"content": new.upper().replace(".", "!"), "scope": "user", "importance": 0.8},
                    {
                        "content": f"The user now prefers report format {self.n}.",
                        "scope": "user",
                        "importance": 0.7,
                        "replaces": first_ref,
                    },
                ]
            }
        )


class CachedEmbedder:
    """The hashing embedder's vectors, computed outside the timed region."""

    relevance_threshold = HASHING.relevance_threshold

    def __init__(self) -> None:
        self.cache: dict[str, list[float]] = {}

    @property
    def model_id(self) -> str:
        return MODEL_ID

    @property
    def dimensions(self) -> int:
        return DIMS

    def warm(self, texts: Sequence[str]) -> None:
        for text in texts:
            self.cache.setdefault(text, HASHING.embed_sync(text))

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [self.cache.get(t) or HASHING.embed_sync(t) for t in texts]

    async def embed_query(self, text: str) -> list[float]:
        return HASHING.embed_sync(text)


class TimedStore(PostgresLongTermStore):
    """Times each fact's add_fact call (the whole per-fact transaction) and the render query."""

    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self.samples: dict[str, list[float]] = {
            "new": [],
            "restatement": [],
            "supersede": [],
            "duplicate": [],
        }
        self.render: list[float] = []
        self.recording = False

    async def current_memories(self, *args: Any, **kwargs: Any) -> list[Memory]:
        t = time.perf_counter()
        rows = await super().current_memories(*args, **kwargs)
        if self.recording:
            self.render.append(time.perf_counter() - t)
        return rows

    async def add_fact(self, *args: Any, **kwargs: Any) -> FactResult:
        t = time.perf_counter()
        result = await super().add_fact(*args, **kwargs)
        elapsed = time.perf_counter() - t
        if result.restatement_of is not None:
            kind = "restatement"
        elif result.superseded is not None:
            kind = "supersede"
        else:
            kind = "new" if result.created else "duplicate"
        if self.recording:
            self.samples[kind].append(elapsed)
        return result


def owner_of(u: int) -> MemoryOwner:
    return MemoryOwner(tenant_id=f"t{u % TENANTS}", principal_id=f"u{u}", session_id=f"bench-{u}")


async def measure(app_url: str, users: int, calls: int) -> dict[str, list[float]]:
    db = Database(app_url, min_size=1, max_size=2)
    await db.open()
    store = TimedStore(db)
    model = ThreeFacts()
    embedder = CachedEmbedder()
    extractor = MemoryExtractor(memories=store, model=model, embedder=embedder)
    messages = [
        ConversationMessage(
            id=1, role="user", content="I booked the Lisbon trip; use the new format."
        )
    ]
    rng = random.Random(11)
    per_call: list[float] = []
    stored = 0
    for i in range(50 + calls):
        owner = owner_of(rng.randint(1, users))
        n = model.n + 1
        new = f"The user booked trip number {n} to Lisbon for the budget review."
        embedder.warm(
            [new, new.upper().replace(".", "!"), f"The user now prefers report format {n}."]
        )
        store.recording = i >= 50
        t = time.perf_counter()
        got = await extractor.extract(owner, messages)
        elapsed = time.perf_counter() - t
        if store.recording:
            per_call.append(elapsed)
            stored += len(got)
    await db.close()
    out = dict(store.samples)
    out["all facts"] = [v for kind in ("new", "restatement", "supersede") for v in out[kind]]
    out["writes (new + supersede)"] = out["new"] + out["supersede"]
    out["render query (per call)"] = store.render
    out["extract() (per call, 3 facts)"] = per_call
    print(f"stored {stored} memories in {calls} timed calls", flush=True)
    return out


def explain(su: str, users: int) -> None:
    """EXPLAIN ANALYZE of the three named queries as the app role, for one owner."""
    owner = owner_of(users // 2)
    url = with_params(su, dbname="harbor", user="harbor_app")
    vector = vector_literal(HASHING.embed_sync("The user booked a trip to Lisbon."))
    with psycopg.connect(url) as c:
        c.execute(query("set_identity"), identity_params(owner))
        nearest = {
            **owner.key(MemoryScope.USER),
            "scope": "user",
            "model_id": MODEL_ID,
            "dims": DIMS,
            "embedding": vector,
            "exclude_ids": [],
        }
        for name, params in [
            ("extraction_nearest_memory", nearest),
            ("extraction_current_memories", current_memories_params(owner, CHAT_SCOPES, 50)),
        ]:
            print(f"\n-- {name}")
            rows = c.execute("explain (analyze, costs off) " + query(name), params).fetchall()
            for (line,) in rows:
                if "'[" in line:
                    line = line[: line.index("'[")] + "'[...]'" + line[line.rindex("]'") + 2 :]
                print(line)
        c.rollback()


QUESTION = "What does storing an extracted fact cost the database?"


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; ``argv`` as on the command line."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks extraction", description=__doc__)
    ap.add_argument("--memories", type=int, default=100_000)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--shared-buffers", help="restart the server with this much, e.g. 1GB")
    ap.add_argument(
        "--synchronous-commit",
        choices=["on", "off"],
        default="on",
        help="synchronous_commit for the application role (experiment)",
    )
    ap.add_argument("--explain", action="store_true", help="print the query plans too")
    ap.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    args = ap.parse_args(argv)
    with private_server() as (su, base):
        server.bootstrap(su)
        migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
        build(su, args.memories, args.users)
        if args.shared_buffers:
            restart_with(su, base / "pgdata", args.shared_buffers)
        if args.synchronous_commit == "off":
            with psycopg.connect(with_params(su, dbname="harbor"), autocommit=True) as c:
                c.execute("alter role harbor_app set synchronous_commit = off")
        if args.explain:
            explain(su, args.users)
        res = asyncio.run(
            measure(with_params(su, dbname="harbor", user="harbor_app"), args.users, args.calls)
        )
    print(f"\nmachine: {machine()}")
    print(
        f"server: shared_buffers {args.shared_buffers or '128MB (default)'}, "
        f"synchronous_commit {args.synchronous_commit} for harbor_app"
    )
    print(
        f"data: {args.memories:,} memories with {DIMS}-d vectors, {args.users:,} users, "
        f"{TENANTS} tenants; {args.calls} extract() calls of 3 facts each"
    )
    print("database work per fact (add_fact; model and embedder excluded):")
    for name, values in res.items():
        if values:
            print(f"  {name:30s} {summary_ms(values)}")
    if args.record:
        record(
            "extraction",
            title="Extraction, database work per fact (`extraction`)",
            data=f"{args.memories:,} memories with {DIMS}-d vectors, {args.users:,} users;"
            f" {args.calls} extract() calls of 3 facts; shared_buffers"
            f" {args.shared_buffers or 'as harbor-pg sizes it'}, synchronous_commit"
            f" {args.synchronous_commit}",
            header=["path", "p50 ms", "p95 ms", "p99 ms"],
            rows=[latency_row(name, values) for name, values in res.items() if values],
        )


if __name__ == "__main__":
    main()
