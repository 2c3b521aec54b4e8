"""A mixed load through MemoryManager on the embedded server: throughput and
per-operation latency at 1, 4, 16 and 64 clients, where the time goes, and
which pool size fits the machine.

    python benchmarks/load.py [--seconds 6] [--clients 1,4,16,64] [--pools 2,4,8,16] [--record]

``--record`` writes the runs' table into benchmarks/RESULTS.md: the ``load``
section (mixed load, pool sizes, a start during load), or with ``--mode start``
the ``load-start`` section (the windows with and without a start).

Loopback only (the embedded server's Unix socket), bounded in time (each run
lasts ``--seconds``). Each client is an asyncio task on one event loop and one
Database (the application pool) issuing 40% append, 25% recent, 20% recall,
15% save (inject_memory, hashing embedder) for one of 200 owners.

Per run: ops/s, p50/p99 per operation, and per operation on average: the mean
latency split into the wait for a pooled connection (the pool's own
statistics) and the rest (round trips and server work with the connection,
and the client's own work), and the CPU the client (this process) and the
server (every PostgreSQL process of the data directory, from /proc) spent.
Then the same load at 16 clients with several pool sizes, and 16
clients while another worker starts (migrate.upgrade against the up-to-date
schema): errors and the slowest call.

``--mode start``: 16 clients run without pause while, every other window of
``--window`` seconds (in the order start, none, none, start, ...), a worker
starts in a process of its own: ``MemoryManager.create(data_dir=...)`` against
the already-migrated embedded server, as a second application process would.
Reported: request p50/p99, the slowest request and the errors of the windows
with a start against those without, each request counted in the window it
ended in. ``--compare DIR``: a third kind of window, where the worker imports
harbor_pg from DIR (another checkout; see ``benchmarks/startup.py --warm``),
interleaved with the other two. ``--nice N``: one more kind, this checkout's
start under ``nice -n N`` (a worker started at a lower CPU priority). A worker
reads compiled bytecode as an installed package does (``startup.deployed_env``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (
    RESULTS,
    machine,
    pct,
    private_server,
    record,
    server_cpu_seconds,
    with_params,
)
from startup import deployed_env

from harbor_pg import ConversationMessage, HashingEmbedder, MemoryManager, MemoryOwner
from harbor_pg.db import migrate, server
from harbor_pg.db.connection import Database, default_pool_size
from harbor_pg.errors import MemoryError

OWNERS = 200
WORDS = [
    "pipeline",
    "ingest",
    "deploy",
    "vector",
    "review",
    "budget",
    "schema",
    "index",
    "backup",
    "alert",
]
MIX = [("append", 40), ("recent", 25), ("recall", 20), ("save", 15)]


def owners() -> list[MemoryOwner]:
    return [
        MemoryOwner(tenant_id=f"t{i % 10}", principal_id=f"u{i}", session_id=f"s{i}")
        for i in range(OWNERS)
    ]


async def run(
    app_url: str,
    pgdata: Path,
    clients: int,
    seconds: float,
    pool: int,
    *,
    start_worker: str | None = None,
) -> dict[str, Any]:
    db = Database(app_url, min_size=min(pool, clients), max_size=pool)
    await db.open()
    manager = MemoryManager.from_database(db, embedder=HashingEmbedder())
    people = owners()
    latencies: dict[str, list[float]] = defaultdict(list)
    errors: list[str] = []
    ops = [name for name, weight in MIX for _ in range(weight)]

    async def client(seed: int, deadline: float) -> None:
        rng = random.Random(seed)
        while time.perf_counter() < deadline:
            owner = rng.choice(people)
            op = rng.choice(ops)
            words = " ".join(rng.sample(WORDS, 3))
            t0 = time.perf_counter()
            try:
                if op == "append":
                    await manager.append(owner, ConversationMessage(role="user", content=words))
                elif op == "recent":
                    await manager.recent(owner, 12)
                elif op == "recall":
                    await manager.recall(owner, words)
                else:
                    await manager.inject_memory(owner, f"{owner.principal_id} works on {words}")
            except MemoryError as exc:
                errors.append(f"{op}: {exc}")
            latencies[op].append(time.perf_counter() - t0)

    # warm up (connections, prepared statements), then measure
    await asyncio.gather(*(client(i, time.perf_counter() + 0.5) for i in range(clients)))
    latencies.clear()
    db._pool.pop_stats()
    cpu_client, cpu_server = time.process_time(), server_cpu_seconds(pgdata)
    starter = None
    if start_worker is not None:
        owner_url = start_worker

        def start() -> None:
            time.sleep(seconds / 3)
            migrate.upgrade(owner_url)

        starter = threading.Thread(target=start)
        starter.start()
    t0 = time.perf_counter()
    await asyncio.gather(*(client(1000 + i, t0 + seconds) for i in range(clients)))
    wall = time.perf_counter() - t0
    cpu_client, cpu_server = (
        time.process_time() - cpu_client,
        server_cpu_seconds(pgdata) - cpu_server,
    )
    stats = db._pool.pop_stats()
    if starter is not None:
        starter.join()
    await manager.close()
    await db.close()
    n = sum(len(v) for v in latencies.values())
    requests = max(stats.get("requests_num", 0), 1)
    return {
        "clients": clients,
        "pool": pool,
        "ops": n,
        "ops_s": n / wall,
        "per_op": {
            op: (statistics.median(v) * 1000, pct(v, 99) * 1000, len(v))
            for op, v in sorted(latencies.items())
        },
        "max_ms": max((max(v) for v in latencies.values()), default=0) * 1000,
        "pool_wait_ms": stats.get("requests_wait_ms", 0) / requests,
        "mean_ms": statistics.fmean(v for vs in latencies.values() for v in vs) * 1000,
        "queued": stats.get("requests_queued", 0),
        "client_cpu_ms": cpu_client / n * 1000,
        "server_cpu_ms": cpu_server / n * 1000,
        "errors": errors,
    }


START_SCRIPT = """
import asyncio, resource, sys, time
t0 = time.perf_counter()
from harbor_pg import MemoryManager
async def main():
    manager = await MemoryManager.create(data_dir=sys.argv[1], embeddings=False)
    await manager.close()
asyncio.run(main())
u = resource.getrusage(resource.RUSAGE_SELF)
print(f"{time.perf_counter() - t0:.1f} s ({u.ru_utime + u.ru_stime:.1f} s CPU)")
"""


async def run_start_windows(
    app_url: str,
    su_url: str,
    data_dir: Path,
    clients: int,
    window: float,
    pairs: int,
    pool: int,
    compare: str | None = None,
    nice: int = 0,
) -> dict[str, Any]:
    """16 clients without pause; a worker process starting in every other window.
    Every 0.1 s, the server's backends waiting for a lock are counted."""
    db = Database(app_url, min_size=min(pool, clients), max_size=pool)
    await db.open()
    manager = MemoryManager.from_database(db, embedder=HashingEmbedder())
    people = owners()
    ops = [name for name, weight in MIX for _ in range(weight)]
    done: list[tuple[float, float, str | None]] = []  # (end time, latency, error)
    stop = asyncio.Event()

    async def client(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            owner = rng.choice(people)
            op = rng.choice(ops)
            words = " ".join(rng.sample(WORDS, 3))
            t0 = time.perf_counter()
            error = None
            try:
                if op == "append":
                    await manager.append(owner, ConversationMessage(role="user", content=words))
                elif op == "recent":
                    await manager.recent(owner, 12)
                elif op == "recall":
                    await manager.recall(owner, words)
                else:
                    await manager.inject_memory(owner, f"{owner.principal_id} works on {words}")
            except MemoryError as exc:
                error = f"{op}: {exc}"
            t1 = time.perf_counter()
            done.append((t1, t1 - t0, error))

    lock_waits: list[tuple[float, int]] = []

    async def watch_locks() -> None:
        async with await psycopg.AsyncConnection.connect(su_url, autocommit=True) as conn:
            while not stop.is_set():
                cur = await conn.execute(
                    "select count(*) from pg_stat_activity where wait_event_type = 'Lock'"
                )
                row = await cur.fetchone()
                lock_waits.append((time.perf_counter(), int(row[0]) if row else 0))
                await asyncio.sleep(0.1)

    # a worker reads compiled bytecode, as an installed package does (pip writes it);
    # the first start of each checkout, before the clients, writes it
    cache = Path(data_dir) / "pycache"
    envs = {"start": deployed_env(dict(os.environ), cache)}
    if compare:
        envs["compare"] = {**envs["start"], "PYTHONPATH": compare}
    if nice:
        envs["nice"] = envs["start"]
    for env in envs.values():
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            START_SCRIPT,
            str(data_dir),
            env=env,
            cwd="/",
            stdout=asyncio.subprocess.DEVNULL,
        )
        await child.wait()
    tasks = [asyncio.create_task(client(i)) for i in range(clients)]
    tasks.append(asyncio.create_task(watch_locks()))
    await asyncio.sleep(1.0)  # warm up
    kinds = ("start", "none", *(["compare"] if compare else []), *(["nice"] if nice else []))
    cycle = [*kinds, *kinds[::-1]]
    plan = [w for _ in range(pairs) for w in cycle][: len(kinds) * pairs]
    windows: list[tuple[str, float, float, str]] = []
    for kind in plan:
        t0 = time.perf_counter()
        child = None
        if kind != "none":
            env = envs[kind]
            child = await asyncio.create_subprocess_exec(
                *(["nice", "-n", str(nice)] if kind == "nice" else []),
                sys.executable,
                "-c",
                START_SCRIPT,
                str(data_dir),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd="/",
            )
        await asyncio.sleep(window)
        took = ""
        if child is not None:
            out, err = await child.communicate()
            took = out.decode().strip() or f"failed: {err.decode()[-300:]}"
        # a start that outlasts its window (a niced one waits for idle CPU) keeps the
        # window open until it ends: every request it may have slowed is counted
        windows.append((kind, t0, max(t0 + window, time.perf_counter()), took))
    stop.set()
    await asyncio.gather(*tasks)
    await manager.close()
    await db.close()
    result: dict[str, Any] = {}
    for kind in kinds:
        lat = [x for k, a, b, _ in windows if k == kind for t, x, _ in done if a <= t < b]
        errs = [e for k, a, b, _ in windows if k == kind for t, _, e in done if a <= t < b and e]
        result[kind] = {
            "n": len(lat),
            "p50": statistics.median(lat) * 1000,
            "p99": pct(lat, 99) * 1000,
            "max": max(lat) * 1000,
            "errors": errs,
            "ops_s": len(lat) / sum(b - a for k, a, b, _ in windows if k == kind),
            "lock_waits": max(
                (n for k, a, b, _ in windows if k == kind for t, n in lock_waits if a <= t < b),
                default=0,
            ),
            # each window's own throughput: their spread is the run-to-run noise a
            # start's effect is held against
            "window_ops": [
                sum(a <= t < b for t, _x, _e in done) / (b - a)
                for k, a, b, _ in windows
                if k == kind
            ],
        }
    for kind in kinds:
        # requests the windows of this kind served fewer than the same time without a
        # start would have, per start (negative: more; the machine's noise)
        count = sum(k == kind for k, *_ in windows)
        seconds = sum(b - a for k, a, b, _ in windows if k == kind)
        expected = result["none"]["ops_s"] * seconds
        result[kind]["lost"] = (expected - result[kind]["n"]) / count if kind != "none" else 0.0
    result["starts"] = [took for k, _, _, took in windows if k == "start"]
    result["compare_starts"] = [took for k, _, _, took in windows if k == "compare"]
    result["nice_starts"] = [took for k, _, _, took in windows if k == "nice"]
    result["kinds"] = kinds
    return result


def report(r: dict[str, Any]) -> None:
    ops = ", ".join(f"{op} {p50:.1f}/{p99:.1f}" for op, (p50, p99, _) in r["per_op"].items())
    print(
        f"  {r['clients']:>3} clients, pool {r['pool']:>2}: {r['ops_s']:7.0f} ops/s;"
        f" p50/p99 ms: {ops}\n"
        f"      per op: mean {r['mean_ms']:.1f} ms = pool wait {r['pool_wait_ms']:.1f} ms +"
        f" {r['mean_ms'] - r['pool_wait_ms']:.1f} ms with a connection; CPU per op: client"
        f" {r['client_cpu_ms']:.2f} ms, server"
        f" {r['server_cpu_ms']:.2f} ms; queued {r['queued']}, errors {len(r['errors'])},"
        f" slowest {r['max_ms']:.0f} ms",
        flush=True,
    )


MIX_LABEL = "40% append, 25% recent, 20% recall, 15% save (hashing embedder), 200 owners"


def load_row(kind: str, r: dict[str, Any]) -> list[str]:
    """One run's row of the ``load`` table (latencies p50 / p99 ms)."""
    return [
        kind,
        str(r["clients"]),
        str(r["pool"]),
        f"{r['ops_s']:.0f}",
        *(
            f"{r['per_op'][op][0]:.1f} / {r['per_op'][op][1]:.1f}" if op in r["per_op"] else "-"
            for op in ("append", "recent", "recall", "save")
        ),
        f"{r['pool_wait_ms']:.1f} ms",
        f"{r['client_cpu_ms']:.2f} ms",
        f"{r['server_cpu_ms']:.2f} ms",
        str(len(r["errors"])),
    ]


def write_results(
    runs: list[tuple[str, dict[str, Any]]],
    seconds: float,
    *,
    path: Path = RESULTS,
    note: str = "",
) -> None:
    """Replace RESULTS.md's ``load`` section with these runs (kind, run's figures)."""
    record(
        "load",
        title="Mixed load, pool sizing, a start during load (`load`)",
        data=f"{MIX_LABEL}; one event loop, Unix socket; {seconds:g} s a run",
        header=[
            "run",
            "clients",
            "pool",
            "ops/s",
            "append",
            "recent",
            "recall",
            "save",
            "pool wait / op",
            "client CPU / op",
            "server CPU / op",
            "errors",
        ],
        rows=[load_row(kind, r) for kind, r in runs],
        notes="append / recent / recall / save: p50 / p99 ms. CPU per op: this process"
        " (the clients) and every PostgreSQL process of the data directory, per operation."
        + (f"\n\n{note}" if note else ""),
        results=path,
    )


def _mean_sd(values: list[float]) -> str:
    """``mean ± sd`` of per-window throughputs (sd 0 with one window)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.0f} ± {sd:.0f}"


def write_start_results(
    r: dict[str, Any], window: float, *, path: Path = RESULTS, note: str = ""
) -> None:
    """Replace RESULTS.md's ``load-start`` section with the windows of a ``--mode start`` run."""
    record(
        "load-start",
        title="A worker start during 16 clients of mixed load (`load --mode start`)",
        data=f"{MIX_LABEL}; 16 clients; windows of {window:g} s, a worker start"
        " (MemoryManager.create in a process of its own) in every other one",
        header=[
            "window",
            "requests",
            "ops/s",
            "p50 ms",
            "p99 ms",
            "slowest ms",
            "errors",
            "most backends waiting for a lock",
            "requests lost a start",
            "ops/s a window, mean ± sd",
        ],
        rows=[
            [
                kind,
                r[kind]["n"],
                f"{r[kind]['ops_s']:.0f}",
                f"{r[kind]['p50']:.1f}",
                f"{r[kind]['p99']:.1f}",
                f"{r[kind]['max']:.0f}",
                len(r[kind]["errors"]),
                r[kind]["lock_waits"],
                f"{r[kind]['lost']:.0f}" if "lost" in r[kind] and kind != "none" else "-",
                _mean_sd(r[kind]["window_ops"]),
            ]
            for kind in r["kinds"]
        ],
        notes="Worker starts took (s): "
        + (", ".join(r["starts"]) or "-")
        + ("; compared checkout: " + ", ".join(r["compare_starts"]) if r["compare_starts"] else "")
        + ("; under nice: " + ", ".join(r["nice_starts"]) if r.get("nice_starts") else "")
        + (f"\n\n{note}" if note else ""),
        results=path,
    )


async def run_all(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--pools", default="2,4,8,16", help="'' for none")
    parser.add_argument(
        "--no-start-run", action="store_true", help="leave out the run with a worker starting"
    )
    parser.add_argument("--mode", choices=["all", "start"], default="all")
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--compare", help="another checkout whose start to interleave")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="a further kind of window: this checkout's start under `nice -n N`",
    )
    parser.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    parser.add_argument("--note", default="", help="(--record) a paragraph under the table")
    args = parser.parse_args(argv)
    runs: list[tuple[str, dict[str, Any]]] = []
    print(f"machine: {machine()}; default pool size here: {default_pool_size()}")
    with private_server() as (su, base):
        server.bootstrap(su)
        base_url = with_params(su, dbname=server.DATABASE)
        owner_url = with_params(base_url, user=server.OWNER_ROLE)
        migrate.upgrade(owner_url)
        app_url = with_params(base_url, user=server.APP_ROLE)
        pgdata = (base / "pgdata").resolve()
        if args.mode == "start":
            r = await run_start_windows(
                app_url,
                base_url,
                pgdata.parent,
                16,
                args.window,
                args.pairs,
                default_pool_size(),
                args.compare,
                args.nice,
            )
            print(
                f"16 clients, windows of {args.window:.0f} s; worker starts took (s):",
                ", ".join(r["starts"]),
            )
            if r["compare_starts"]:
                print(f"  starts of {args.compare}:", ", ".join(r["compare_starts"]))
            if r["nice_starts"]:
                print(f"  starts under nice -n {args.nice}:", ", ".join(r["nice_starts"]))
            for kind in r["kinds"]:
                w = r[kind]
                print(
                    f"  {kind:>5}: {w['n']} requests, {w['ops_s']:.0f} ops/s,"
                    f" p50 {w['p50']:.1f} ms, p99 {w['p99']:.1f} ms, slowest {w['max']:.0f} ms,"
                    f" errors {len(w['errors'])}, most backends waiting for a lock at once"
                    f" {w['lock_waits']}, requests lost a start {w['lost']:.0f},"
                    f" ops/s a window {_mean_sd(w['window_ops'])}",
                    flush=True,
                )
                for line in w["errors"][:5]:
                    print("     ", line)
            if args.record:
                write_start_results(r, args.window, note=args.note)
            return  # (leaving the block stops the server)
        print("mixed load (40% append, 25% recent, 20% recall, 15% save):")
        for clients in [int(c) for c in args.clients.split(",")]:
            r = await run(app_url, pgdata, clients, args.seconds, default_pool_size())
            report(r)
            runs.append(("mixed", r))
        print("pool sizes at 16 clients:")
        for pool in [int(p) for p in args.pools.split(",") if p.strip()]:
            r = await run(app_url, pgdata, 16, args.seconds, pool)
            report(r)
            runs.append(("pool size", r))
        if not args.no_start_run:
            print("16 clients while another worker starts (migrate.upgrade, schema up to date):")
            r = await run(
                app_url, pgdata, 16, args.seconds, default_pool_size(), start_worker=owner_url
            )
            report(r)
            runs.append(("a worker starts", r))
            for line in r["errors"][:5]:
                print("     ", line)
    if args.record:
        write_results(runs, args.seconds, note=args.note)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(run_all(argv))


if __name__ == "__main__":
    main()
    os._exit(0)  # nothing left to wait for (the server stopped with its block)
