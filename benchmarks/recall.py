"""Latency and completeness of harbor.recall() at 10k / 100k / 1M memories.

    python -m benchmarks recall [--sizes 10000,100000,1000000] [--skewed 100000]
                                [--queries 300] [--top-k 25] [--data-dir DIR | --fresh]
                                [--order tenant|interleaved] [--shared-buffers SIZE]
                                [--ids short|uuid] [--record]
    python -m benchmarks recall --mode first-touch ...   (--mode first-touch --help)
    python -m benchmarks recall --mode ab --ref COMMIT ...   (--mode ab --help)

Modes: ``latency`` (the default, below); ``first-touch``, where the first
question to an owner whose pages are not in the shared buffers spends its time
(``_recall_first_touch.py``); ``ab``, the recall SQL of another commit against
this checkout's, question by question on one server (``_recall_ab.py``), for
changes smaller than the run-to-run noise of this benchmark.

For each size: a fresh embedded server, memories of 1,000 tenants (one user
each, USER scope) with 384-dimension vectors drawn around 200 topic centres
and text from per-topic vocabularies, written with binary COPY; then the
HNSW, GIN and B-tree indexes are built and the table analysed. The skewed set
puts ``--skewed`` memories in one tenant among 999 small ones (``--skewed``
more memories over them). The rows are written round robin over the tenants
(row i of every tenant, then row i + 1), so that each owner's rows are spread
over the table as a live service with many users leaves them; ``--order
tenant`` writes them a tenant at a time instead, each owner's rows side by
side (faster, and not what a live service sees). The kept sets of the two orders live side by
side under ``--data-dir`` (``uniform-SIZE`` and ``uniform-SIZE-interleaved``).
Tenants are named t0 ... t999, users u-<tenant> and memories <tenant>-<n>;
``--ids uuid`` names the tenants of the uniform sets by UUIDs instead, which
makes every owner key and id as long as a service that uses UUIDs would have
them, and so the index entries larger (kept as ``uniform-SIZE-uuid...``).

Servers start as harbor-pg starts its embedded one (shared buffers sized to
the machine, ``HARBOR_SHARED_BUFFERS`` to choose). Then, as ``harbor_app``
under row-level security with the identity set per
transaction and query embeddings precomputed, on connections that have
already switched to prepared statements (psycopg prepares after five runs):

* p50 / p95 / p99 of one ``harbor.recall()`` call (hybrid, top_k 25), as the
  questions come (each owner's pages read into shared buffers for the first
  time since the server started), and again after one other question to every
  owner (the steady state of a service whose buffers hold its owners);
* the same question answered the naive way (fetch every visible memory with
  its vector, rank in Python with numpy), as the ratio to beat;
* completeness: how many of top_k came back, and the overlap of the dense
  candidates (``harbor._dense_candidates``, top_k of them) with an exact
  scan of the same visible rows, also after the statements are prepared; and
  how many questions got fewer lexical candidates
  (``harbor._lexical_candidates``) than there are visible rows matching them,
  up to top_k;
* the EXPLAIN plans of the candidate queries at the largest size.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg.types.enum import EnumInfo, register_enum

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    data_home,
    hand_off,
    kept_server,
    machine,
    pct,
    private_server,
    progress,
    record,
    restart_with,
    with_params,
)

from harbor_pg.context.recall import RecallRequest
from harbor_pg.db import migrate, server
from harbor_pg.db.connection import Database
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.tiers.rows import recall_in_one_round_trip

QUESTION = "How fast is recall at my size, and does it return everything it should?"

DIMS = 384
TOPICS = 200
TENANTS = 1000
WORDS_PER_TOPIC = 30
RNG_SEED = 17


def vocabulary() -> list[list[str]]:
    rng = random.Random(RNG_SEED)
    syll = ["ka", "lo", "mi", "ra", "tu", "ve", "zo", "pe", "ni", "sa", "do", "fi", "gu", "be"]
    out = []
    for _ in range(TOPICS):
        out.append(["".join(rng.choice(syll) for _ in range(3)) for _ in range(WORDS_PER_TOPIC)])
    return out


def centres() -> np.ndarray:
    rng = np.random.default_rng(RNG_SEED)
    c = rng.standard_normal((TOPICS, DIMS)).astype(np.float32)
    return c / np.linalg.norm(c, axis=1, keepdims=True)


def rows_of(counts: list[tuple[str, int]]) -> Iterator[list[tuple[tuple[Any, ...], Any]]]:
    """Per tenant, in tenant order: (memory row, vector) pairs, the same data whatever the
    order they are later written in."""
    vocab = vocabulary()
    cen = centres()
    rng = np.random.default_rng(RNG_SEED + 1)
    for tenant, n in counts:
        topics = rng.integers(0, TOPICS, n)
        noise = rng.standard_normal((n, DIMS)).astype(np.float32) * 0.08
        vecs = cen[topics] + noise
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        rows = []
        for i in range(n):
            words = vocab[topics[i]]
            text = " ".join(words[j] for j in rng.integers(0, WORDS_PER_TOPIC, 8))
            memory = (
                tenant,
                f"{tenant}-{i}",
                "user",
                f"u-{tenant}",
                text,
                hashlib.sha256(f"{tenant}-{i}".encode()).hexdigest(),
                (i % 10) / 10,
            )
            rows.append((memory, vecs[i]))
        yield rows


def batches(
    counts: list[tuple[str, int]], order: str
) -> Iterator[list[tuple[tuple[Any, ...], Any]]]:
    """Rows to write, one transaction per batch: a tenant at a time (``tenant``: each
    owner's rows end up side by side in the table), or round robin over the tenants
    (``interleaved``: row i of every tenant, then row i + 1, as a live service with many
    users writes them, so each owner's rows are spread over the whole table)."""
    if order == "tenant":
        yield from rows_of(counts)
        return
    per_tenant = list(rows_of(counts))
    longest = max(len(rows) for rows in per_tenant)
    step = max(1, 10_000 // max(1, len(per_tenant)))
    for start in range(0, longest, step):
        yield [
            rows[i]
            for i in range(start, min(start + step, longest))
            for rows in per_tenant
            if i < len(rows)
        ]


def build(su: str, counts: list[tuple[str, int]], order: str, dbname: str = "harbor") -> float:
    """Write memories and embeddings for (tenant, count) pairs; returns seconds.

    A tenant's vectors go in the HNSW graph when it has harbor.graph_min_vectors() of
    them or more, as the library's writes would have put them (a schema without
    ``in_graph``, before migration 0018, has every vector in the graph)."""
    t0 = time.perf_counter()
    total = sum(n for _, n in counts)
    done = 0
    step = max(1, total // 10)
    with psycopg.connect(with_params(su, dbname=dbname), autocommit=True) as conn:
        has_graph_min = conn.execute(
            "select to_regprocedure('harbor.graph_min_vectors()') is not null"
        ).fetchone()
        min_vectors = None
        if has_graph_min and has_graph_min[0]:
            graph_min = conn.execute("select harbor.graph_min_vectors()").fetchone()
            min_vectors = graph_min[0] if graph_min else None
        size = dict(counts)
        register_vector(conn)
        conn.execute("set maintenance_work_mem = '3GB'")
        scope_info = EnumInfo.fetch(conn, "harbor.memory_scope")
        assert scope_info is not None
        register_enum(scope_info, conn)
        user_scope = (
            scope_info.enum["USER"]
            if "USER" in scope_info.enum.__members__
            else scope_info.enum["user"]
        )
        # dropped for the load and built again afterwards as the schema defines them
        rebuilt = ("memory_embeddings_hnsw_384", "memories_owner_terms_idx")
        definitions = dict(
            conn.execute(
                "select indexname, indexdef from pg_indexes"
                " where schemaname = 'harbor' and indexname = any (%s)",
                (list(rebuilt),),
            ).fetchall()
        )
        for name in rebuilt:
            conn.execute(f"drop index harbor.{name}")
        for batch in batches(counts, order):
            with conn.transaction():
                with conn.cursor().copy(
                    "copy harbor.memories (tenant_id, id, scope, user_id, content, content_hash,"
                    " importance) from stdin"
                ) as copy:
                    for memory, _vec in batch:
                        copy.write_row(memory)
                graph = ", in_graph" if min_vectors is not None else ""
                # the vectors' owner check off (memory_embeddings_owner): as the superuser,
                # with no policy to give its lookup a tenant, it probes every tenant's part
                # of the key, about 6 ms a row (1,000,000 rows would take well over an
                # hour); these rows match their memories by construction
                conn.execute("set local session_replication_role = replica")
                with conn.cursor().copy(
                    "copy harbor.memory_embeddings (tenant_id, memory_id, model_id, dims,"
                    f" embedding, scope, user_id{graph}) from stdin with (format binary)"
                ) as copy:
                    types = ["text", "text", "text", "int4", "vector", "harbor.memory_scope"]
                    copy.set_types(types + ["text"] + (["bool"] if graph else []))
                    for memory, vec in batch:
                        row = (memory[0], memory[1], "bench", DIMS, vec, user_scope, memory[3])
                        if min_vectors is not None:
                            row += (size[memory[0]] >= min_vectors,)
                        copy.write_row(row)
            before, done = done, done + len(batch)
            if len(counts) < 50 or done // step > before // step:
                print(
                    f"  wrote {done:,}/{total:,} memories ({time.perf_counter() - t0:.0f}s)",
                    flush=True,
                )
        t1 = time.perf_counter()
        conn.execute(definitions["memory_embeddings_hnsw_384"])
        print(f"  HNSW index built in {time.perf_counter() - t1:.0f}s", flush=True)
        conn.execute(definitions["memories_owner_terms_idx"])
        conn.execute("vacuum analyze harbor.memories")
        conn.execute("vacuum analyze harbor.memory_embeddings")
    return time.perf_counter() - t0


def queries(n: int, tenants: list[tuple[str, int]], seed: int) -> list[tuple[str, str, Any]]:
    """(tenant, text, embedding) questions near a random topic."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary()
    cen = centres()
    out = []
    for _ in range(n):
        tenant = tenants[int(rng.integers(0, len(tenants)))][0]
        topic = int(rng.integers(0, TOPICS))
        v = cen[topic] + rng.standard_normal(DIMS).astype(np.float32) * 0.08
        v /= np.linalg.norm(v)
        words = vocab[topic]
        text = "what about " + " ".join(words[j] for j in rng.integers(0, WORDS_PER_TOPIC, 3))
        out.append((tenant, text, v))
    return out


def tenant_name(i: int, ids: str = "short") -> str:
    """The i-th tenant of a uniform set: ``t<i>``, or with ``ids="uuid"`` a UUID derived
    from it (the same on every run)."""
    return f"t{i}" if ids == "short" else str(uuid.uuid5(uuid.NAMESPACE_URL, f"harbor-bench/t{i}"))


def owner_of(tenant: str) -> MemoryOwner:
    return MemoryOwner(tenant_id=tenant, principal_id=f"u-{tenant}")


def request_for(text: str, vector: Any, top_k: int) -> RecallRequest:
    return RecallRequest(
        query=text,
        scopes=(MemoryScope.USER,),
        top_k=top_k,
        embedding=[float(x) for x in vector],
        model_id="bench",
        recency_half_life_hours=168.0,
    )


async def measure(
    app_url: str,
    qs: list[tuple[str, str, Any]],
    top_k: int,
    warm: list[tuple[str, str, Any]] | None = None,
) -> dict[str, Any]:
    """Latency of ``qs`` as they come (each owner's pages read in for the first
    time since the server started, unless another question touched them), then,
    given ``warm`` (other questions), after those have been asked: the steady
    state of a service whose shared buffers hold the owners it serves."""
    db = Database(app_url, min_size=1, max_size=1)
    await db.open()
    lat: list[float] = []
    steady: list[float] = []
    counts: list[int] = []
    overlaps: list[float] = []
    short = 0
    # warm up: the driver prepares the statement after five executions
    for tenant, text, v in qs[:10]:
        await recall_in_one_round_trip(db, owner_of(tenant), request_for(text, v, top_k))
    for tenant, text, v in progress(qs, label="questions"):
        owner = owner_of(tenant)
        t = time.perf_counter()
        # what MemoryRecall does: one transaction with the identity, one round trip
        got = await recall_in_one_round_trip(db, owner, request_for(text, v, top_k))
        lat.append(time.perf_counter() - t)
        counts.append(len(got))
    if warm is not None:
        for tenant, text, v in warm:
            await recall_in_one_round_trip(db, owner_of(tenant), request_for(text, v, top_k))
        for tenant, text, v in qs:
            t = time.perf_counter()
            await recall_in_one_round_trip(db, owner_of(tenant), request_for(text, v, top_k))
            steady.append(time.perf_counter() - t)
    # completeness of the dense candidates (what the HNSW walk or the exact
    # scan hands to the ranking) against an exact scan of the same visible rows;
    # of the lexical candidates, how many came back against how many of the
    # visible rows match the question (up to top_k)
    lexical_short = 0
    for tenant, text, v in qs[: min(len(qs), 100)]:
        owner = owner_of(tenant)
        vec = "[" + ",".join(f"{float(x):.6f}" for x in v) + "]"
        async with db.transaction(owner) as conn:
            cur = await conn.execute(
                "select memory_id from harbor._dense_candidates(%s::vector, 'bench', '{user}',"
                " now(), %s) order by dense_rank, memory_id",
                (vec, top_k),
            )
            dense = [r["memory_id"] for r in await cur.fetchall()]
            cur = await conn.execute(
                "select e.memory_id from harbor.memory_embeddings e"
                " where e.tenant_id = %s and e.dims = 384"
                " order by e.embedding <=> %s::vector limit %s",
                (tenant, vec, top_k),
            )
            exact = [r["memory_id"] for r in await cur.fetchall()]
            cur = await conn.execute(
                "select (select count(*) from harbor._lexical_candidates(%s, '{user}', now(), %s))"
                " as returned,"
                " (select count(*) from (select 1 from harbor.memories m"
                "  where m.fts @@ harbor.or_tsquery(%s) and m.valid @> now()"
                "  and m.memory_type <> 'summary' limit %s) x) as matching",
                (text, top_k, text, top_k),
            )
            row = await cur.fetchone()
            if row is not None and row["returned"] < row["matching"]:
                lexical_short += 1
        if len(dense) < len(exact):
            short += 1
        overlaps.append(len(set(dense) & set(exact)) / max(1, len(exact)))
    await db.close()
    return {
        "lat": lat,
        "steady": steady,
        "counts": counts,
        "overlap": overlaps,
        "short": short,
        "lexical_short": lexical_short,
    }


def naive(app_url: str, qs: list[tuple[str, str, Any]], top_k: int, n: int) -> list[float]:
    """Fetch every visible memory with its vector, rank in Python (numpy)."""
    out = []
    with psycopg.connect(app_url, autocommit=True) as conn:
        register_vector(conn)
        for tenant, text, v in qs[:n]:
            o = owner_of(tenant)
            t = time.perf_counter()
            with conn.transaction():
                conn.execute(
                    "select harbor.set_identity(%s, principal_id => %s)",
                    (o.tenant_id, o.principal_id),
                )
                # two plain reads (the joined query got a pathological plan under
                # row-level security for the 100,000-row tenant: 27 s)
                vectors = dict(
                    conn.execute(
                        "select memory_id, embedding from harbor.memory_embeddings"
                        " where tenant_id = %s and user_id = %s",
                        (o.tenant_id, o.principal_id),
                    ).fetchall()
                )
                rows = [
                    (mid, content, importance, vectors[mid])
                    for mid, content, importance in conn.execute(
                        "select id, content, importance from harbor.memories"
                        " where tenant_id = %s and user_id = %s and valid @> now()",
                        (o.tenant_id, o.principal_id),
                    ).fetchall()
                    if mid in vectors
                ]
            if rows:
                mat = np.stack([r[3].to_numpy() for r in rows])
                dense = np.argsort(-(mat @ v))[:100]
                terms = set(text.split())
                lex = sorted(range(len(rows)), key=lambda i: -len(terms & set(rows[i][1].split())))[
                    :100
                ]
                score: dict[int, float] = {}
                for rank, i in enumerate(dense, 1):
                    score[int(i)] = score.get(int(i), 0) + 1 / (60 + rank)
                for rank, i in enumerate(lex, 1):
                    score[i] = score.get(i, 0) + 1 / (60 + rank)
                best = sorted(score, key=lambda i: -score[i] * (1 + rows[i][2]))[:top_k]
                assert best
            out.append(time.perf_counter() - t)
    return out


def explain(su: str, tenant: str, text: str, v: Any) -> None:
    with psycopg.connect(with_params(su, dbname="harbor", user="harbor_app"), autocommit=True) as c:
        c.execute("select harbor.set_identity(%s, principal_id => %s)", (tenant, f"u-{tenant}"))
        vec = "[" + ",".join(f"{float(x):.6f}" for x in v) + "]"
        print(f"\nEXPLAIN harbor.recall(...) for tenant {tenant}:")
        for (line,) in c.execute(
            "explain (analyze, buffers, costs off) select * from harbor.recall(%s,"
            " %s::vector, 'bench', '{user}', 25)",
            (text, vec),
        ):
            print("   ", line)
    # the candidate statements themselves, as harbor_search sees them
    with psycopg.connect(with_params(su, dbname="harbor"), autocommit=True) as c:
        c.execute("load 'auto_explain'")
        for setting in ("log_nested_statements", "log_analyze", "log_buffers"):
            c.execute(f"set auto_explain.{setting} = on")
        c.execute("set auto_explain.log_min_duration = 0")
        c.execute("set auto_explain.log_level = notice")
        c.execute("set role harbor_app")
        c.execute("select harbor.set_identity(%s, principal_id => %s)", (tenant, f"u-{tenant}"))
        notes: list[str] = []
        c.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
        c.execute(
            "select * from harbor.recall(%s, %s::vector, 'bench', '{user}', 25)", (text, vec)
        ).fetchall()
        print(f"\nnested plans (auto_explain) for tenant {tenant}:")
        for note in notes:
            if "harbor.memories m" in note or "memory_embeddings e" in note:
                print("    " + note.replace("\n", "\n    "))


def set_label(kind: str, order: str) -> str:
    """A data set's name in the output (``uniform 1,000,000 interleaved``); ``kept_dir``
    turns it into the directory under ``--data-dir``."""
    return kind if order == "tenant" else f"{kind} interleaved"


def kept_dir(data_dir: Path, label: str) -> Path:
    return data_dir / label.replace(" ", "-").replace(",", "")


def run_size(
    label: str,
    counts: list[tuple[str, int]],
    args: argparse.Namespace,
    probe: list[str],
    show_plans: bool,
) -> list[list[str]]:
    """Measure one data set; the rows it adds to the results table."""
    rows: list[list[str]] = []
    total = sum(n for _, n in counts)
    print(f"\n== {label}: {total:,} memories, {len(counts)} tenants ==", flush=True)
    kept = None if args.fresh else kept_dir(args.data_dir, label)
    with kept_server(kept) if kept else private_server() as (su, base):
        marker = base / "built.json"
        if marker.exists():
            # built by an earlier run: the current SQL functions are applied again
            secs = float(json.loads(marker.read_text())["seconds"])
            migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
            print(f"  reusing {base} (built earlier in {secs:.0f}s)", flush=True)
        else:
            server.bootstrap(su)
            migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
            secs = build(su, counts, args.order)
            print(f"  built in {secs:.0f}s", flush=True)
            if kept:
                marker.write_text(json.dumps({"seconds": secs, "counts": len(counts)}))
        if args.shared_buffers:
            restart_with(su, base / "pgdata", args.shared_buffers)
            # a kept set starts with harbor-pg's own size again next time
            with psycopg.connect(su, autocommit=True) as c:
                c.execute("alter system reset shared_buffers")
        app = with_params(su, dbname="harbor", user="harbor_app")
        for name in probe:
            chosen = [c for c in counts if c[0] == name] if name != "*" else counts
            qs = queries(args.queries, chosen, seed=hash(name) & 0xFFFF)
            # one other question for every owner of the probe
            warm = [
                (chosen[i][0], text, v)
                for i, (_, text, v) in enumerate(queries(len(chosen), chosen, seed=7))
            ]
            res = asyncio.run(measure(app, qs, args.top_k, warm))
            nv = naive(app, qs, args.top_k, 5 if name != "*" else 30)
            ms = [x * 1000 for x in res["lat"]]
            p50 = statistics.median(ms)
            naive_p50 = statistics.median(nv) * 1000
            who = "random tenants" if name == "*" else f"tenant {name} ({chosen[0][1]:,} rows)"
            print(
                f"  {who}: harbor.recall p50 {p50:.2f} ms, p95 {pct(ms, 95):.2f} ms,"
                f" p99 {pct(ms, 99):.2f} ms (n={len(ms)}); naive p50 {naive_p50:.2f} ms"
                f" (x{naive_p50 / p50:.1f}); returned {statistics.mean(res['counts']):.1f}"
                f"/{args.top_k} on average, min {min(res['counts'])}; dense overlap with exact"
                f" {100 * statistics.mean(res['overlap']):.1f}% (min"
                f" {100 * min(res['overlap']):.0f}%), short results {res['short']};"
                f" lexical candidates short of the matching rows {res['lexical_short']}",
                flush=True,
            )
            st = [x * 1000 for x in res["steady"]]
            print(
                f"  {who}, steady state (after one question to each of its"
                f" {len(warm):,} owners): harbor.recall p50 {statistics.median(st):.2f} ms,"
                f" p95 {pct(st, 95):.2f} ms, p99 {pct(st, 99):.2f} ms",
                flush=True,
            )
            rows.append(
                [
                    label,
                    "random owners" if name == "*" else f"{name} ({chosen[0][1]:,} memories)",
                    f"{p50:.2f} / {pct(ms, 99):.2f}",
                    f"{statistics.median(st):.2f} / {pct(st, 99):.2f}",
                    f"{naive_p50:.2f} (x{naive_p50 / p50:.1f})",
                    f"{statistics.mean(res['counts']):.1f} of {args.top_k}",
                    f"{100 * statistics.mean(res['overlap']):.1f}%"
                    f" (min {100 * min(res['overlap']):.0f}%)",
                    f"{res['short']} / {res['lexical_short']}",
                ]
            )
            if show_plans:
                explain(su, qs[0][0], qs[0][1], qs[0][2])
    return rows


MODES = ("latency", "first-touch", "ab")


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; ``argv`` as on the command line (``--mode`` picks the mode)."""
    # (this opening is startup.py's too, by shape: each benchmark with modes starts so)
    argv = list(sys.argv[1:] if argv is None else argv)
    if hand_off(argv, MODES, "latency", {"first-touch": "_recall_first_touch", "ab": "_recall_ab"}):
        return
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks recall",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument(
        "--mode",
        choices=MODES,
        default="latency",
        help="latency (this page), first-touch or ab (each has its own --help)",
    )
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--skewed", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--top-k", type=int, default=25)
    ap.add_argument("--plans", action="store_true", help="print EXPLAIN at the largest size")
    ap.add_argument(
        "--order",
        choices=("tenant", "interleaved"),
        default="interleaved",
        help="the order the data is written in: interleaved, round robin over the tenants (each"
        " owner's rows spread over the table, as a live service writes them), or a tenant at a"
        " time (each owner's rows side by side on disk); default: %(default)s",
    )
    ap.add_argument(
        "--shared-buffers",
        help="restart each server with this much shared memory (e.g. 4GB, set with ALTER SYSTEM"
        " and reset after the run) and prewarm the memory tables; default: what harbor-pg gives"
        " the embedded server (a quarter of the memory, at most 8GB; HARBOR_SHARED_BUFFERS)",
    )
    ap.add_argument(
        "--data-dir",
        type=Path,
        default=data_home(),
        help="keep each data set's server under this directory and reuse it on the next run"
        " (the current SQL functions are applied again); default: %(default)s",
    )
    ap.add_argument(
        "--fresh", action="store_true", help="a temporary server, removed after the run"
    )
    ap.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    ap.add_argument(
        "--ids",
        choices=("short", "uuid"),
        default="short",
        help="tenant names for the uniform sets: short (t0 ... t999), or UUIDs as a service"
        " might use, which make the user and memory ids as long (u-<uuid>, <uuid>-<n>) and each"
        " index entry larger (a separate kept set); default: %(default)s",
    )
    args = ap.parse_args(argv)
    print(f"machine: {machine()}")
    rows: list[list[str]] = []
    sizes = [int(s) for s in args.sizes.split(",") if s]
    for size in sizes:
        per, extra = divmod(size, TENANTS)
        counts = [(tenant_name(i, args.ids), per + (1 if i < extra else 0)) for i in range(TENANTS)]
        kind = f"uniform {size:,}" + (" uuid" if args.ids == "uuid" else "")
        label = set_label(kind, args.order)
        rows += run_size(label, counts, args, ["*"], args.plans and size == max(sizes))
    if args.skewed:
        small = args.skewed // (TENANTS - 1)
        counts = [("big", args.skewed)] + [(f"t{i}", small) for i in range(1, TENANTS)]
        rows += run_size(set_label("skewed", args.order), counts, args, ["big", "*"], args.plans)
    if args.record:
        record(
            "recall",
            title="Recall latency and completeness (`recall`)",
            data=f"1,000 tenants, one user each, 384-dim vectors around 200 topics, written"
            f" {args.order}; {args.queries} questions a set, hybrid, top_k {args.top_k};"
            " as harbor_app under row-level security",
            header=[
                "set",
                "asked",
                "p50 / p99 ms as questions come",
                "p50 / p99 ms steady state",
                "naive p50 ms (ratio)",
                "returned",
                "dense overlap with exact",
                "short dense / lexical",
            ],
            rows=rows,
        )


if __name__ == "__main__":
    main()
