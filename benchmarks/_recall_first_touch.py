"""``recall --mode first-touch``: where the first question to a cold owner spends its time.

    python -m benchmarks recall --mode first-touch [--data-dir DIR] [--size 1000000]
                                [--owners 200] [--small-buffers 1GB] [--seed 11]

``recall`` measures each question "as it comes" right after the server
started, and again once every owner's pages are in the shared buffers. The
first figure is above the second by a few ms at 1,000,000 memories. This splits
that difference on the kept set ``DIR/uniform-SIZE-interleaved`` (built by
``recall`` at that size), with the same call as ``recall.py`` (the
library's one-round-trip ``harbor.recall()`` as ``harbor_app`` under
row-level security, hybrid, top_k 25):

* **fresh start**: the server started as harbor-pg starts it (its shared
  buffers sized to the machine, none of them used yet); the relations a
  recall reads are first copied into the operating system's cache
  (``pg_prewarm(..., 'read')``, which does not fill the shared buffers), so
  the question reads no disk. Then one question to each of ``--owners``
  owners no question has touched, then the same questions again;
* **warm server**: restarted with ``--small-buffers`` of shared buffers, all
  of them filled first by prewarming the 384-dimension HNSW index (larger
  than the buffers), so every buffer has been used once, as in a service that
  has run for a while. Then one question to each of ``--owners`` other owners
  (their pages come from the operating system's cache into buffers whose
  memory exists: the kernel no longer allocates and zeroes it, though each
  new server process still maps it page by page), and the same questions
  again.

For each phase: the p50 of the first and the second question and the median
of their paired differences, and, on Linux, per question, the
pages the server process read from files (``rchar`` in ``/proc/PID/io`` over
8 kB: reads the OS cache served count too) and the page faults it took
(minor faults in ``/proc/PID/stat``: two for each 8 kB buffer the process
touches for the first time, the kernel mapping it a page of shared memory).

The kept set's shared buffers are reset to harbor-pg's own size at the end.
About 15 s at 1,000,000 memories.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    check_size,
    data_home,
    kept_server,
    machine,
    recall_relations,
    restart_server,
    with_params,
)
from recall import kept_dir, owner_of, queries, request_for, set_label, tenant_name

from harbor_pg.db import migrate
from harbor_pg.db.connection import Database
from harbor_pg.tiers.rows import recall_in_one_round_trip


def server_pid(su_db: str) -> int | None:
    with psycopg.connect(su_db) as c:
        row = c.execute(
            "select pid from pg_stat_activity where backend_type = 'client backend'"
            " and usename = 'harbor_app' and state is not null"
            " order by backend_start desc limit 1"
        ).fetchone()
    return int(row[0]) if row else None


def process_counts(pid: int | None) -> tuple[int, int] | None:
    """(bytes read through read calls, minor page faults) of a server process, from
    /proc (Linux); None elsewhere. The bytes count reads served by the OS cache too."""
    if pid is None:
        return None
    try:
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
    return int(io["rchar"]), int(fields[7])  # minflt: the 10th field of the line


def read_into_os_cache(su_db: str) -> float:
    t = time.perf_counter()
    with psycopg.connect(su_db, autocommit=True) as c:
        c.execute("create extension if not exists pg_prewarm")
        for rel in recall_relations(c, vector_table=False):
            c.execute("select pg_prewarm(%s, 'read')", (rel,))
    return time.perf_counter() - t


async def ask_each(
    app: str, su_db: str, qs: list[tuple[str, str, Any]], warmup: list[tuple[str, str, Any]]
) -> dict[str, Any]:
    """One question to each owner of ``qs`` (none touched before), then the same again;
    per question: the time, the shared-buffer reads and the server process's page faults."""
    db = Database(app, min_size=1, max_size=1)
    await db.open()
    try:
        # the driver prepares after five executions; these owners are not measured
        for tenant, text, v in warmup:
            await recall_in_one_round_trip(db, owner_of(tenant), request_for(text, v, 25))
        pid = server_pid(su_db)
        out: dict[str, Any] = {}
        for label in ("first", "again"):
            lat: list[float] = []
            before = process_counts(pid)
            for tenant, text, v in qs:
                t = time.perf_counter()
                await recall_in_one_round_trip(db, owner_of(tenant), request_for(text, v, 25))
                lat.append(time.perf_counter() - t)
            after = process_counts(pid)
            out[label] = lat
            out[label + "_counts"] = (
                None
                if before is None or after is None
                else ((after[0] - before[0]) / 8192 / len(qs), (after[1] - before[1]) / len(qs))
            )
        return out
    finally:
        await db.close()


def report(phase: str, res: dict[str, Any]) -> None:
    first = [x * 1000 for x in res["first"]]
    again = [x * 1000 for x in res["again"]]
    diff = statistics.median(a - b for a, b in zip(first, again, strict=True))

    def counts(key: str) -> str:
        value = res[key + "_counts"]
        if value is None:
            return ""
        return f" ({value[0]:.0f} pages read, {value[1]:.0f} page faults a question)"

    print(
        f"  {phase}: first question p50 {statistics.median(first):.2f} ms{counts('first')};"
        f" the same again p50 {statistics.median(again):.2f} ms{counts('again')};"
        f" paired difference {diff:+.2f} ms (n={len(first)})",
        flush=True,
    )


def distinct_owners(n: int, start: int, seed: int) -> list[tuple[str, str, Any]]:
    """``n`` questions, each to a different owner among t<start>... (the uniform set's
    1,000 owners), none of them t0-t9 (the warm-up's)."""
    pool = [(tenant_name(i), 0) for i in range(start, 1000)]
    out: list[tuple[str, str, Any]] = []
    seen: set[str] = set()
    for q in queries(20 * n, pool, seed):
        if q[0] not in seen:
            seen.add(q[0])
            out.append(q)
        if len(out) == n:
            break
    return out


def main(argv: list[str] | None = None) -> None:
    """Run the two phases; ``argv`` as on the command line after ``--mode first-touch``."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks recall --mode first-touch",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    ap.add_argument("--data-dir", type=Path, default=data_home(), help="default: %(default)s")
    ap.add_argument("--size", type=int, default=1_000_000, help="which kept uniform set")
    ap.add_argument("--owners", type=int, default=200)
    ap.add_argument("--small-buffers", default="1GB")
    ap.add_argument("--seed", type=int, default=11)
    args = ap.parse_args(argv)
    if not 10 <= args.owners <= 330:
        raise SystemExit("--owners takes 10 to 330 (three sets of that many distinct owners)")
    check_size("--small-buffers", args.small_buffers)
    base = kept_dir(args.data_dir, set_label(f"uniform {args.size:,}", "interleaved"))
    if not (base / "built.json").exists():
        raise SystemExit(
            f"no kept set in {base}: build it with python -m benchmarks recall --sizes {args.size}"
        )
    print(machine(), flush=True)
    warmup = queries(10, [(tenant_name(i), 0) for i in range(10)], args.seed)
    fresh = distinct_owners(args.owners, 10, args.seed)
    taken = {t for t, _, _ in fresh}
    warm_pool = [q for q in distinct_owners(990, 10, args.seed + 1) if q[0] not in taken]
    warm_owners = warm_pool[: args.owners]
    with kept_server(base) as (su, _):
        pgdata = base / "pgdata"
        su_db = with_params(su, dbname="harbor")
        migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"), progress=None)
        try:
            # a fresh start: nothing in the shared buffers, none of them used yet
            restart_server(su, pgdata, None)
            took = read_into_os_cache(su_db)
            with psycopg.connect(su_db) as c:
                size = c.execute("show shared_buffers").fetchone()
            print(
                f"fresh start, shared_buffers {size[0] if size else '?'}; the recall relations"
                f" read into the OS cache in {took:.1f} s",
                flush=True,
            )
            app = with_params(su, dbname="harbor", user="harbor_app")
            report("fresh start", asyncio.run(ask_each(app, su_db, fresh, warmup)))
            # a server whose every buffer has been used: other owners, their pages
            # coming from the OS cache into buffers that exist
            restart_server(su, pgdata, args.small_buffers)
            t = time.perf_counter()
            with psycopg.connect(su_db, autocommit=True) as c:
                c.execute("select pg_prewarm('harbor.memory_embeddings_hnsw_384')")
            took = read_into_os_cache(su_db)
            print(
                f"warm server, shared_buffers {args.small_buffers}, every buffer used by"
                f" prewarming the HNSW index; relations re-read into the OS cache"
                f" ({time.perf_counter() - t:.1f} s in all)",
                flush=True,
            )
            report("warm server", asyncio.run(ask_each(app, su_db, warm_owners, warmup)))
        finally:
            with psycopg.connect(su, autocommit=True) as c:
                c.execute("alter system reset shared_buffers")
