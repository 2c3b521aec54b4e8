"""The owner-term lookup of the lexical leg (migration 0008): what it saves, what it costs.

    python benchmarks/owner_terms.py --data-dir DIR [--size 1000000] [--queries 300]
                                     [--term-limit 32] [--seed 7] [--rebuild]

On the kept set ``DIR/uniform-SIZE-interleaved`` (built by ``recall.py
--data-dir DIR``), migrated to the current schema:

* ``--rebuild`` first times migration 0008 itself: a downgrade to 0007 (which
  drops the index) and the upgrade that builds it again, with the index size;
* the lexical leg alone, ``harbor._lexical_candidates()`` as ``harbor_app``
  under row-level security, with the lookup (``p_term_limit`` =
  ``--term-limit``) and without it (0, the owner scan), alternating question
  by question on one connection: the p50 of each, the median of the paired
  differences, and how many answers were identical (ids and scores); as the
  questions come (the server just started, so each owner's pages are read
  for the first time), then again with the pages in the buffers. For the
  benchmark's questions (random tenants; 10-18 of an owner's 1,000 memories
  share a word with each), and for an owner whose every memory matches: a
  copy of tenant t0's 1,000 memories with two words added to each (tenant
  ``allmatch``, removed at the end), asked those words, where the lookup
  finds more than the limit and falls back to the owner scan;
* the leg for questions of 3 to 200 words drawn from every topic (each word
  matches a few of an owner's memories, so long questions match many; above
  16 lexemes the leg skips the lookup), 40 a length, each asked once before
  it is timed;
* writing memories with and without the index: 2,000 rows by ``INSERT ...
  SELECT`` in transactions that are rolled back (the index dropped inside the
  transaction for "without"), six alternating runs, the median time a row.

About 20 s at 1,000,000 (40 s with ``--rebuild``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import kept_server, machine, with_params
from recall import kept_dir, queries, set_label, tenant_name, vocabulary

from harbor_pg.db import migrate

LEG = (
    "select memory_id, lexical_score from harbor._lexical_candidates(%s, '{user}', now(), 50,"
    " 2000, %s) order by memory_id"
)


def rebuild(owner_url: str, su_db_url: str) -> None:
    migrate.downgrade(owner_url, "0007", progress=None)
    t = time.perf_counter()
    migrate.upgrade(owner_url, progress=None)
    took = time.perf_counter() - t
    with psycopg.connect(su_db_url) as conn:
        row = conn.execute(
            "select pg_size_pretty(pg_relation_size('harbor.memories_owner_terms_idx'))"
        ).fetchone()
    print(f"migration 0008 (from 0007): {took:.1f} s, index {row[0] if row else '?'}")


def add_allmatch(su_db_url: str) -> None:
    with psycopg.connect(su_db_url, autocommit=True) as conn:
        conn.execute("delete from harbor.memories where tenant_id = 'allmatch'")
        conn.execute(
            "insert into harbor.memories (tenant_id, id, scope, user_id, content,"
            " content_hash, importance)"
            " select 'allmatch', 'allmatch-' || id, scope, 'u-allmatch',"
            " content || ' zebra yak', md5(id) || md5(content), importance"
            " from harbor.memories where tenant_id = %s",
            (tenant_name(0),),
        )
        conn.execute("vacuum analyze harbor.memories")


def drop_allmatch(su_db_url: str) -> None:
    with psycopg.connect(su_db_url, autocommit=True) as conn:
        conn.execute("delete from harbor.memories where tenant_id = 'allmatch'")
        conn.execute("vacuum analyze harbor.memories")


def paired_leg(app_url: str, label: str, qs: list[tuple[str, str]], limit: int) -> None:
    """The leg with the lookup and without, alternating which goes first."""
    with psycopg.connect(app_url, autocommit=True) as conn:

        def call(tenant: str, text: str, term_limit: int) -> tuple[float, list[Any]]:
            t = time.perf_counter()
            with conn.transaction():
                conn.execute(
                    "select harbor.set_identity(%s, principal_id => %s)", (tenant, f"u-{tenant}")
                )
                rows = conn.execute(LEG, (text, term_limit)).fetchall()
            return time.perf_counter() - t, rows

        for tenant, text in qs[:20]:  # past the driver's switch to prepared statements
            call(tenant, text, limit)
            call(tenant, text, 0)
        # twice: as the questions come (each owner's pages read for the first time
        # since the server started, unless an earlier question read them), then
        # again (the pages in the buffers)
        for phase in ("as the questions came", "steady state"):
            with_lookup: list[float] = []
            without: list[float] = []
            diffs: list[float] = []
            same = 0
            for i, (tenant, text) in enumerate(qs):
                if i % 2:
                    ta, ra = call(tenant, text, limit)
                    tb, rb = call(tenant, text, 0)
                else:
                    tb, rb = call(tenant, text, 0)
                    ta, ra = call(tenant, text, limit)
                with_lookup.append(ta)
                without.append(tb)
                diffs.append(ta - tb)
                same += ra == rb
            print(
                f"{label}, {phase}: with the lookup p50"
                f" {statistics.median(with_lookup) * 1e3:.3f} ms, owner scan p50"
                f" {statistics.median(without) * 1e3:.3f} ms, paired median"
                f" {statistics.median(diffs) * 1e3:+.3f} ms; identical {same} of {len(qs)}",
                flush=True,
            )


def by_length(app_url: str, limit: int, seed: int, per_length: int = 40) -> None:
    """Questions of n words drawn from every topic's vocabulary (so that each
    word matches a few of an owner's memories and long questions match many),
    each asked once before it is timed, paired as above."""
    rng = random.Random(seed)
    words = [w for topic in vocabulary() for w in topic]
    with psycopg.connect(app_url, autocommit=True) as conn:

        def call(tenant: str, text: str, term_limit: int) -> float:
            with conn.transaction():
                conn.execute(
                    "select harbor.set_identity(%s, principal_id => %s)", (tenant, f"u-{tenant}")
                )
                t = time.perf_counter()
                conn.execute(LEG, (text, term_limit)).fetchall()
                return time.perf_counter() - t

        for n in (3, 5, 10, 20, 50, 200):
            pairs = []
            for i in range(per_length):
                tenant = tenant_name(rng.randrange(1000))
                text = " ".join(rng.choice(words) for _ in range(n))
                call(tenant, text, limit)
                call(tenant, text, 0)
                if i % 2:
                    pairs.append((call(tenant, text, limit), call(tenant, text, 0)))
                else:
                    b = call(tenant, text, 0)
                    pairs.append((call(tenant, text, limit), b))
            print(
                f"questions of {n} random words: with the lookup p50"
                f" {statistics.median(a for a, _ in pairs) * 1e3:.3f} ms, owner scan p50"
                f" {statistics.median(b for _, b in pairs) * 1e3:.3f} ms, paired median"
                f" {statistics.median(a - b for a, b in pairs) * 1e3:+.3f} ms",
                flush=True,
            )


def write_cost(su_db_url: str, runs: int = 6, rows: int = 2000) -> None:
    sql = (
        "insert into harbor.memories (tenant_id, id, scope, user_id, content, content_hash)"
        " select 'w' || (g %% 50), 'w-' || g || '-' || %s, 'user', 'u',"
        " 'the harbor pilot ' || g || ' moved crane number ' || (g * 7)"
        " || ' to the north pier before the storm of ' || (g %% 31),"
        " md5(g::text || %s) || md5(g::text)"
        " from generate_series(1, %s) g"
    )
    per_row: dict[bool, list[float]] = {True: [], False: []}
    with psycopg.connect(su_db_url, autocommit=True) as conn:
        for run in range(runs):
            for with_index in (True, False) if run % 2 else (False, True):
                with conn.transaction(force_rollback=True):
                    if not with_index:
                        conn.execute("drop index harbor.memories_owner_terms_idx")
                    t = time.perf_counter()
                    conn.execute(sql, (str(run), str(run), rows))
                    per_row[with_index].append((time.perf_counter() - t) / rows)
    on, off = (statistics.median(per_row[k]) * 1e6 for k in (True, False))
    print(
        f"writing memories ({rows:,} rows a run, {runs} runs each): {on:.1f} us a row with"
        f" the index, {off:.1f} us without (+{on - off:.1f} us)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="as given to recall.py")
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--term-limit", type=int, default=32)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rebuild", action="store_true", help="time migration 0008 first")
    args = ap.parse_args()
    if args.term_limit < 1:
        raise SystemExit("--term-limit must be at least 1 (0 is the owner scan compared with)")
    base = kept_dir(args.data_dir, set_label(f"uniform {args.size:,}", "interleaved"))
    if not (base / "built.json").exists():
        raise SystemExit(f"no kept set at {base}: build it with recall.py --data-dir")
    print(f"machine: {machine()}")
    print(f"set {base}, term limit {args.term_limit}", flush=True)
    with kept_server(base) as (su, _):
        owner_url = with_params(su, dbname="harbor", user="harbor_owner")
        su_db_url = with_params(su, dbname="harbor")
        app_url = with_params(su, dbname="harbor", user="harbor_app")
        migrate.upgrade(owner_url, progress=None)
        if args.rebuild:
            rebuild(owner_url, su_db_url)
        counts = [(tenant_name(i), args.size // 1000) for i in range(1000)]
        focused = [(t, text) for t, text, _v in queries(args.queries, counts, seed=args.seed)]
        paired_leg(app_url, "benchmark questions", focused, args.term_limit)
        add_allmatch(su_db_url)
        try:
            words = ("", "harbor", "pier")
            allmatch = [
                ("allmatch", f"what about zebra yak {words[i % 3]}") for i in range(args.queries)
            ]
            paired_leg(app_url, "an owner whose every memory matches", allmatch, args.term_limit)
        finally:
            drop_allmatch(su_db_url)
        by_length(app_url, args.term_limit, args.seed)
        write_cost(su_db_url)


if __name__ == "__main__":
    main()
