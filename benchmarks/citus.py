"""One server against a three-node Citus cluster on this machine.

The same set on both: MEMORIES user-scoped memories over TENANTS tenants (ten
users each), loaded with one INSERT ... SELECT as the superuser, no vectors
(lexical recall). Both run from the embedded binaries with the same settings
(harbor_pg.testing.nodes: shared_buffers 128MB, fsync off); the cluster is a
coordinator and two workers, 8 shards a table. Then, through the wrapper
(MemoryManager on Database pools, identity by set_config on one server and by
SET LOCAL on Citus), ROUNDS calls each of recall, search, append, recent (the
session's newest 12 turns, after the append) and save for random owners: p50/p99 in
ms. The two run at once and take turns: each round makes its five calls on one side
and then on the other, the same owner and question on both, one server first in
even rounds and the cluster first in odd ones, so that a change in the machine's
speed during the run reaches both sides alike. recall() never raises: the calls it
answered with a WARNING (a statement Citus could not plan) are counted.

    .venv/bin/python benchmarks/citus.py [MEMORIES] [TENANTS] [ROUNDS] [--record]

``--record`` writes the table into benchmarks/RESULTS.md's ``citus`` section.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import psycopg

from harbor_pg.db import citus, migrate, server
from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.testing.nodes import start_cluster, start_node

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, machine, pct, record

_WORD_TEXT = (
    "ingest pipeline review budget travel invoice lighthouse harbor garden kitchen "
    "printer server backup release roadmap hiring onboarding laptop badge parking "
    "meeting deadline customer contract renewal vendor design database index query "
    "recall memory summary tenant project session policy audit report dashboard "
    "alert incident outage deploy rollback feature branch ticket sprint retro coffee "
)
WORDS = _WORD_TEXT.split()

LOAD = """
insert into harbor.memories (tenant_id, scope, user_id, principal_id, content, content_hash)
select 't' || (i %% %(tenants)s), 'user', 'u' || ((i / %(tenants)s) %% 10),
       'u' || ((i / %(tenants)s) %% 10),
       w[1 + i %% 50] || ' ' || w[1 + (i * 7) %% 50] || ' ' || w[1 + (i * 13) %% 50]
         || ' note ' || i,
       md5(i::text) || md5('x' || i)
  from generate_series(1, %(n)s) i, (select %(words)s::text[] as w) words
"""


#: the calls measured, in the order each round makes them
CALLS = ("recall", "search", "append", "recent", "save")


class _Count(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.n = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "recall" in record.getMessage():
            self.n += 1


async def _measure(
    urls: dict[str, tuple[str, str]], tenants: int, rounds: int, counter: _Count
) -> dict[str, dict[str, list[float]]]:
    """``rounds`` rounds of the five calls on each side of ``urls`` (side -> application
    and elevated URLs), the sides in turn (the first side first in even rounds, the
    other in odd ones), the same owner and question on both. Per side: each call's
    times in seconds, and under "failed recalls" the recalls answered with a WARNING."""
    dbs = {
        side: Database(app, admin, min_size=1, max_size=2) for side, (app, admin) in urls.items()
    }
    for db in dbs.values():
        await db.open()
    managers = {side: MemoryManager.from_database(db) for side, db in dbs.items()}
    rng = random.Random(7)
    out: dict[str, dict[str, list[float]]] = {
        side: {**{name: [] for name in CALLS}, "failed recalls": [0.0]} for side in urls
    }
    sides = list(urls)
    for i in range(rounds):
        t, u = rng.randrange(tenants), rng.randrange(10)
        owner = MemoryOwner(tenant_id=f"t{t}", principal_id=f"u{u}", session_id="bench")
        question = f"{rng.choice(WORDS)} {rng.choice(WORDS)}"
        message = ConversationMessage(role="user", content=question)
        for side in sides if i % 2 == 0 else sides[::-1]:
            manager = managers[side]
            warned = counter.n
            t0 = time.perf_counter()
            await manager.recall(owner, question)
            t1 = time.perf_counter()
            out[side]["failed recalls"][0] += counter.n - warned
            await manager.search(owner, question)
            t2 = time.perf_counter()
            await manager.append(owner, message)
            t3 = time.perf_counter()
            await manager.recent(owner, 12)
            t4 = time.perf_counter()
            await manager.save(owner, Memory(content=f"bench fact {i} {question}"))
            t5 = time.perf_counter()
            took = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)
            for name, seconds in zip(CALLS, took, strict=True):
                out[side][name].append(seconds)
    for manager in managers.values():
        await manager.close()
    for db in dbs.values():
        await db.close()
    return out


def _load(url: str, n: int, tenants: int) -> float:
    t0 = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(LOAD, {"n": n, "tenants": tenants, "words": WORDS})
        conn.execute("analyze")
    return time.perf_counter() - t0


def table(results: dict[str, dict[str, list[float]]], rounds: int) -> list[list[str]]:
    """The rows of the comparison: per call, p50 / p99 ms on each side and the p50 ratio."""
    rows = []
    for name in CALLS:
        a, b = results["one server"][name], results["cluster"][name]
        rows.append(
            [
                name,
                f"{pct(a, 50) * 1000:.2f} / {pct(a, 99) * 1000:.2f}",
                f"{pct(b, 50) * 1000:.2f} / {pct(b, 99) * 1000:.2f}",
                f"{pct(b, 50) / pct(a, 50):.1f}x",
            ]
        )
    rows.append(
        [
            "recalls answered empty (WARNING)",
            f"{results['one server']['failed recalls'][0]:.0f} of {rounds}",
            f"{results['cluster']['failed recalls'][0]:.0f} of {rounds}",
            "",
        ]
    )
    return rows


def write_results(
    results: dict[str, dict[str, list[float]]],
    n: int,
    tenants: int,
    rounds: int,
    *,
    shards: dict[str, int] | None = None,
    path: Path = RESULTS,
    note: str = "",
) -> None:
    """Replace RESULTS.md's ``citus`` section with this run's table (``shards``: the
    shards of harbor.memories per node, from distribute's report)."""
    per_node = (
        "; shards of harbor.memories per worker: "
        + ", ".join(str(count) for _node, count in sorted(shards.items()))
        if shards
        else ""
    )
    record(
        "citus",
        title="Citus: one server against a 3-node cluster on this machine (`citus`)",
        data=f"{n:,} user memories, {tenants:,} tenants, no vectors; cluster = coordinator"
        f" + 2 workers, 8 shards a table{per_node}",
        header=[
            f"call ({rounds} each, wrapper)",
            "one server p50 / p99 ms",
            "cluster p50 / p99 ms",
            "ratio p50",
        ],
        rows=table(results, rounds),
        notes=note,
        results=path,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("memories", nargs="?", type=int, default=100_000)
    ap.add_argument("tenants", nargs="?", type=int, default=1_000)
    ap.add_argument("rounds", nargs="?", type=int, default=200, help="calls of each kind")
    ap.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    ap.add_argument("--note", default="", help="(--record) a paragraph under the table")
    args = ap.parse_args()
    n, tenants, rounds = args.memories, args.tenants, args.rounds
    counter = _Count()
    logging.getLogger("harbor_pg").addHandler(counter)
    base = Path(tempfile.mkdtemp(prefix="harbor-bench-citus-"))
    results: dict[str, dict[str, list[float]]] = {}
    shards: dict[str, int] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            single = start_node(base / "single", "pg")
            cluster = None
            try:
                server.bootstrap(single.url())
                migrate.upgrade(single.url("harbor", "harbor_owner"))
                loaded = _load(single.url("harbor"), n, tenants)
                print(f"one server: loaded {n} memories in {loaded:.1f}s")
                cluster = start_cluster(base / "cluster")
                cluster.create_database("harbor")
                coord = cluster.coordinator
                migrate.upgrade(coord.url("harbor", "harbor_owner"))
                cluster.add_workers("harbor")
                report = citus.distribute(coord.url("harbor"))
                shards = report.shards
                loaded = _load(coord.url("harbor"), n, tenants)
                print(
                    f"cluster: loaded {n} memories in {loaded:.1f}s; shards of "
                    f"harbor.memories per node: {report.shards}"
                )
                urls = {
                    "one server": (
                        single.url("harbor", "harbor_app"),
                        single.url("harbor", "harbor_admin"),
                    ),
                    "cluster": (
                        coord.url("harbor", "harbor_app"),
                        coord.url("harbor", "harbor_admin"),
                    ),
                }
                # a warm-up pass, then the measured one
                asyncio.run(_measure(urls, tenants, 20, counter))
                results = asyncio.run(_measure(urls, tenants, rounds, counter))
            finally:
                if cluster is not None:
                    cluster.remove()
                single.remove()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(machine())
    print(f"{n} memories, {tenants} tenants, {rounds} calls each")
    print("| call | one server p50 / p99 ms | cluster p50 / p99 ms | ratio p50 |")
    print("|---|---|---|---|")
    for row in table(results, rounds):
        print("| " + " | ".join(row) + " |")
    if args.record:
        write_results(results, n, tenants, rounds, shards=shards, note=args.note)


if __name__ == "__main__":
    main()
