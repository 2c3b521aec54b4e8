"""``recall --mode ab``: old and new recall SQL side by side on one server, paired.

    python -m benchmarks recall --mode ab --ref COMMIT[,COMMIT...] [--data-dir DIR]
                                [--size 1000000] [--queries 400] [--seed 11]
                                [--order tenant|interleaved] [--skewed big|small]
                                [--record [--notes TEXT]]

Whole benchmark runs of ``recall.py`` on this 2-core VM differ by up to 3 ms
between consecutive runs of the same code, far more than most changes are
worth. This script compares two versions of the recall SQL inside one server
and one connection instead, question by question:

* the kept set ``DIR/uniform-SIZE-interleaved`` (built by ``recall``
  at that size; ``DIR/uniform-SIZE`` with ``--order tenant``; with
  ``--skewed``, ``DIR/skewed-interleaved``, asking its 100,000-row tenant
  ``big`` or its ``small`` ones) gets the current SQL (migrate), then the
  recall functions of ``COMMIT``'s ``sql/functions/recall/`` (``recall.sql``
  before it was split) under other
  names (``harbor.recall_ab``, ``harbor._dense_candidates_ab``,
  ``harbor._lexical_candidates_ab``, ``harbor._bm25_ab``; the candidate
  functions owned by ``harbor_search`` as the originals). The helpers they
  call (identity, keys, token counts) are the current ones, so a ``COMMIT``
  whose recall needs other helpers cannot be compared this way;
* each question (random tenants, top_k 25, one fixed ``as_of`` for both) is
  answered by both versions in alternating order, through the library's
  one-round-trip path on one pooled connection;
* it prints each side's p50 as the client sees it, the median of the paired
  differences, each side's mean time inside the server (``track_functions``),
  and how many answers were identical (ids, ranks, scores to 12 digits).

Several refs are compared one after the other on the same questions (the
first pass reads cold owners: its ratio is the least clean). ``--record``
writes one row per ref into RESULTS.md's ``recall-ab`` section.
``--ref HEAD`` compares the current SQL with itself: the noise floor. The
``_ab`` functions and the ``track_functions`` setting are removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    RESULTS,
    data_home,
    kept_server,
    machine,
    pct,
    progress,
    record,
    with_params,
)
from recall import kept_dir, owner_of, queries, request_for, set_label, tenant_name

from harbor_pg.db import migrate
from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query as sql_query
from harbor_pg.tiers.rows import recall_params

ROOT = Path(__file__).resolve().parent.parent
# the functions that make up recall, and which of them run as harbor_search
RENAMED = ("recall", "_dense_candidates", "_lexical_candidates", "_bm25", "recall_line_tokens")
DEFINERS = ("_dense_candidates_ab", "_lexical_candidates_ab")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def recall_sql(ref: str) -> str:
    """The text of ``ref``'s recall SQL: the files of ``sql/functions/recall/``, or
    ``sql/functions/recall.sql`` at a ref from before that folder."""
    try:
        files = [
            f
            for f in _git("ls-tree", "--name-only", f"{ref}:sql/functions/recall/").split()
            if f.endswith(".sql")
        ]
    except subprocess.CalledProcessError:
        files = []
    paths = [f"sql/functions/recall/{f}" for f in files] or ["sql/functions/recall.sql"]
    try:
        return "\n".join(_git("show", f"{ref}:{path}") for path in paths)
    except subprocess.CalledProcessError as exc:
        raise SystemExit(
            f"cannot read the recall SQL (sql/functions/recall/) at {ref}: {exc.stderr.strip()}"
        ) from None


def old_functions(ref: str) -> str:
    """``ref``'s recall functions, renamed with the suffix ``_ab``."""
    text = recall_sql(ref)
    out = []
    for name in RENAMED:
        start = text.find(f"create or replace function harbor.{name}(")
        if start < 0:
            raise SystemExit(f"{ref}'s recall SQL has no harbor.{name}()")
        body_start = text.index("\n", start)
        quoted = text.find("\n$$;", start)
        standard = text.find("\nreturn ", start)  # a SQL-standard body: up to its first ';'
        if standard >= 0 and (quoted < 0 or standard < quoted) and standard > body_start:
            end = text.index(";\n", standard) + 1
        else:
            end = quoted + len("\n$$;")
        out.append(text[start:end])
    body = "\n\n".join(out)
    for name in RENAMED:
        body = body.replace(f"harbor.{name}(", f"harbor.{name}_ab(")
    # harbor.recall() names its parameters recall.<name>
    return re.sub(r"\brecall\.(?=[a-z_]+)", "recall_ab.", body)


def old_query(new_sql: str, old_sql_functions: str) -> str:
    """``new_sql``'s ``harbor.recall(...)`` call aimed at ``recall_ab``, without the named
    arguments the old function does not take (a ref from before an argument was added
    answers with its own defaults for it, as it did on its own)."""
    header = old_sql_functions[
        old_sql_functions.index("create or replace function harbor.recall_ab(") :
    ]
    header = header[: header.index(") returns table")]
    taken = set(re.findall(r"^\s+(\w+) ", header, re.MULTILINE))
    lines = new_sql.replace("from harbor.recall(", "from harbor.recall_ab(").split("\n")
    kept: list[str] = []
    for line in lines:
        m = re.match(r"^\s+(\w+) => .*?(,|\) r)$", line)
        if m and m.group(1) not in taken:
            if m.group(2) == ") r":  # the last argument: the previous one closes the call
                kept[-1] = kept[-1].removesuffix(",") + ") r"
            continue
        kept.append(line)
    return "\n".join(kept)


def install(owner_url: str, su_url: str, sql: str) -> list[str]:
    """Create the ``_ab`` functions; return their signatures."""
    with psycopg.connect(owner_url, autocommit=True) as conn:
        drop_ab(conn)
        conn.execute(sql)
        signatures = [
            r[0]
            for r in conn.execute(
                "select p.oid::regprocedure::text from pg_proc p"
                " where p.pronamespace = 'harbor'::regnamespace and p.proname = any (%s)",
                ([f"{n}_ab" for n in RENAMED],),
            ).fetchall()
        ]
        conn.execute("grant create on schema harbor to harbor_search")
        try:
            for sig in signatures:
                conn.execute(f"grant execute on function {sig} to harbor_app")
                if sig.split("(")[0].removeprefix("harbor.") in DEFINERS:
                    conn.execute(f"alter function {sig} owner to harbor_search")
        finally:
            conn.execute("revoke create on schema harbor from harbor_search")
    with psycopg.connect(su_url, autocommit=True) as conn:
        conn.execute("alter system set track_functions = 'pl'")
        conn.execute("select pg_reload_conf()")
    return signatures


def drop_ab(conn: psycopg.Connection[Any]) -> None:
    for (sig,) in conn.execute(
        "select p.oid::regprocedure::text from pg_proc p"
        " where p.pronamespace = 'harbor'::regnamespace and p.proname = any (%s)",
        ([f"{n}_ab" for n in RENAMED],),
    ).fetchall():
        conn.execute(f"drop function {sig}")


async def server_times(db: Database, su_db_url: str) -> dict[str, tuple[int, float]]:
    # the measuring backend reports its function statistics at the end of its
    # next transaction (otherwise at most once a second, or when idle)
    async with db.autocommit() as conn:
        await conn.execute("select pg_catalog.pg_stat_force_next_flush()")
    await asyncio.sleep(0.2)
    with psycopg.connect(su_db_url, autocommit=True) as conn:
        return {
            r[0]: (int(r[1]), float(r[2]))
            for r in conn.execute(
                "select funcname, calls, total_time from pg_stat_user_functions"
                " where schemaname = 'harbor' and funcname in ('recall', 'recall_ab')"
            ).fetchall()
        }


async def compare(
    app_url: str, su_db_url: str, qs: list[tuple[str, str, Any]], old_functions_sql: str
) -> dict[str, Any]:
    new_sql = sql_query("recall")
    # without the named arguments the old function does not take (it answers with its own
    # defaults for them, as it did on its own)
    old_sql = old_query(new_sql, old_functions_sql)
    if old_sql.count("harbor.recall_ab(") != 1:
        raise SystemExit(
            "the recall query no longer reads 'from harbor.recall(': update this script"
        )
    db = Database(app_url, min_size=1, max_size=1)
    await db.open()
    try:
        # past psycopg's prepare threshold on both statements
        for tenant, text, vector in qs[:10]:
            params = recall_params(request_for(text, vector, 25))
            for sql in (new_sql, old_sql):
                await db.fetch_in_one_round_trip(owner_of(tenant), sql, params)
        before = await server_times(db, su_db_url)
        lat: dict[str, list[float]] = {"old": [], "new": []}
        same = 0
        for i, (tenant, text, vector) in enumerate(progress(qs, label="questions")):
            params = recall_params(request_for(text, vector, 25))
            params["as_of"] = datetime.now(UTC)
            got: dict[str, list[tuple[Any, ...]]] = {}
            for side in ("old", "new") if i % 2 else ("new", "old"):
                t0 = time.perf_counter()
                rows = await db.fetch_in_one_round_trip(
                    owner_of(tenant), old_sql if side == "old" else new_sql, params
                )
                lat[side].append(time.perf_counter() - t0)
                got[side] = [
                    (r["id"], r["rank"], round(r["score"], 12), r["dense_rank"], r["lexical_rank"])
                    for r in rows
                ]
            same += got["old"] == got["new"]
        after = await server_times(db, su_db_url)
    finally:
        await db.close()

    def inside(name: str) -> str:
        calls = after.get(name, (0, 0.0))[0] - before.get(name, (0, 0.0))[0]
        total = after.get(name, (0, 0.0))[1] - before.get(name, (0, 0.0))[1]
        return f"{total / calls:.3f} ms over {calls} calls" if calls else "not reported"

    diffs = sorted(o - n for o, n in zip(lat["old"], lat["new"], strict=True))
    old_ms = [x * 1000 for x in lat["old"]]
    new_ms = [x * 1000 for x in lat["new"]]
    print(
        f"client p50: old {statistics.median(old_ms):.3f} ms,"
        f" new {statistics.median(new_ms):.3f} ms"
        f" (x{statistics.median(new_ms) / statistics.median(old_ms):.3f});"
        f" p99: old {pct(old_ms, 99):.3f} ms, new {pct(new_ms, 99):.3f} ms;"
        f" paired old - new: median {statistics.median(diffs) * 1000:+.3f} ms"
    )
    print(f"inside the server (mean): old {inside('recall_ab')}, new {inside('recall')}")
    print(f"identical answers: {same} of {len(qs)}")
    return {
        "old_p50": statistics.median(old_ms),
        "new_p50": statistics.median(new_ms),
        "old_p99": pct(old_ms, 99),
        "new_p99": pct(new_ms, 99),
        "paired": statistics.median(diffs) * 1000,
        "inside_old": inside("recall_ab"),
        "inside_new": inside("recall"),
        "same": same,
        "n": len(qs),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the paired comparison; ``argv`` as on the command line after ``--mode ab``."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks recall --mode ab",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument(
        "--ref",
        required=True,
        help="the commit whose recall SQL is 'old'; several, comma-separated, are compared"
        " one after the other on the same questions",
    )
    ap.add_argument(
        "--data-dir", type=Path, default=data_home(), help="as given to recall; %(default)s"
    )
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument(
        "--order",
        choices=("tenant", "interleaved"),
        default="interleaved",
        help="which kept set: as given to recall.py --order (default: %(default)s)",
    )
    ap.add_argument(
        "--skewed",
        choices=("big", "small"),
        help="the kept skewed set instead (recall.py --skewed): questions to its large"
        " tenant, or to random small ones",
    )
    ap.add_argument(
        "--record",
        action="store_true",
        help="write the comparison into benchmarks/RESULTS.md's recall-ab section",
    )
    ap.add_argument("--notes", default="", help="prose under the recorded table")
    args = ap.parse_args(argv)
    if args.skewed:
        base = kept_dir(args.data_dir, set_label("skewed", args.order))
        # which tenants are asked (queries() picks among them; the sizes are not read)
        counts = (
            [("big", 0)] if args.skewed == "big" else [(tenant_name(i), 0) for i in range(1, 1000)]
        )
    else:
        base = kept_dir(args.data_dir, set_label(f"uniform {args.size:,}", args.order))
        counts = [(tenant_name(i), args.size // 1000) for i in range(1000)]
    if not (base / "built.json").exists():
        raise SystemExit(f"no kept set at {base}: build it with python -m benchmarks recall")
    refs = [r for r in args.ref.split(",") if r]
    sqls = {ref: old_functions(ref) for ref in refs}
    print(f"machine: {machine()}")
    results: dict[str, dict[str, Any]] = {}
    with kept_server(base) as (su, _):
        owner_url = with_params(su, dbname="harbor", user="harbor_owner")
        su_db_url = with_params(su, dbname="harbor")
        migrate.upgrade(owner_url)
        qs = queries(args.queries, counts, seed=args.seed)
        for ref in refs:
            print(f"\nold: {ref}'s recall SQL; new: this checkout's; set {base}", flush=True)
            install(owner_url, su, sqls[ref])
            try:
                results[ref] = asyncio.run(
                    compare(
                        with_params(su, dbname="harbor", user="harbor_app"),
                        su_db_url,
                        qs,
                        sqls[ref],
                    )
                )
            finally:
                with psycopg.connect(owner_url, autocommit=True) as conn:
                    drop_ab(conn)
                with psycopg.connect(su, autocommit=True) as conn:
                    conn.execute("alter system reset track_functions")
                    conn.execute("select pg_reload_conf()")
    if args.record:
        label = f"skewed ({args.skewed})" if args.skewed else f"uniform {args.size:,}"
        write_results(results, f"{label} {args.order}", args.queries, notes=args.notes)


def write_results(
    results: dict[str, dict[str, Any]],
    kept_set: str,
    questions: int,
    *,
    notes: str = "",
    path: Path = RESULTS,
) -> None:
    """Replace RESULTS.md's ``recall-ab`` section: one row per old commit compared."""
    record(
        "recall-ab",
        title="Recall against older commits' SQL, paired (`recall --mode ab`)",
        data=f"the kept set {kept_set} of `recall` (1,000 tenants, 384-dim vectors around"
        f" 200 topics); {questions} questions to random owners, hybrid, top_k 25, each"
        " answered by an old commit's recall SQL and this checkout's in alternating order"
        " on one connection, as harbor_app under row-level security",
        header=[
            "old",
            "client p50 old / new ms (ratio)",
            "client p99 old / new ms",
            "paired old - new (median)",
            "inside the server (mean) old / new",
            "identical answers",
        ],
        rows=[
            [
                ref,
                f"{res['old_p50']:.2f} / {res['new_p50']:.2f}"
                f" (x{res['new_p50'] / res['old_p50']:.2f})",
                f"{res['old_p99']:.2f} / {res['new_p99']:.2f}",
                f"{res['paired']:+.2f} ms",
                f"{res['inside_old']} / {res['inside_new']}",
                f"{res['same']} of {res['n']}",
            ]
            for ref, res in results.items()
        ],
        notes=notes,
        results=path,
    )
