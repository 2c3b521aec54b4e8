"""Embedded server cold start to first query, and migration of an empty database.

    python -m benchmarks startup [--runs 5]
    python -m benchmarks startup --mode hub [--calls 3]   (a model hub that never answers)

Each run uses a new data directory in a fresh subprocess, so nothing is warm:
"first start" includes initdb, role and extension bootstrap; "restart" starts
the same stopped data directory again; both end at the first query answered
through the application role. "migrate" times Alembic from an empty database
to head (schema + functions + policies).

    python -m benchmarks startup --warm 8 [--compare /path/to/other/checkout]

``--warm N``: the cost of a worker starting beside running ones, N times:
``MemoryManager.create(data_dir=..., embedder=HashingEmbedder())`` in a fresh
subprocess against an embedded server that is already running and migrated.
Per start: the client's CPU (package import, then create() and close()) and
the server's (every PostgreSQL process of the data directory, with the
backends that exited). ``--compare DIR`` alternates each start with one
importing harbor_pg from DIR (another checkout, with ``harbor_pg/_sql`` and
``harbor_pg/_migrations`` linked to its ``sql`` and ``migrations``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import hand_off, machine, record

from harbor_pg.db.server import stop_embedded

CHILD = r"""
import json, sys, time, warnings
t0 = time.perf_counter()
from pathlib import Path
from harbor_pg.db import server, migrate
import psycopg
t_imported = time.perf_counter()
data = Path(sys.argv[1])
info = server.resolve_server(data_dir=data)
t_started = time.perf_counter()
migrated = None
if sys.argv[2] == "migrate":
    t = time.perf_counter()
    migrate.upgrade(info.owner_url)
    migrated = time.perf_counter() - t
with psycopg.connect(info.app_url) as c:
    c.execute("select 1").fetchone()
t_query = time.perf_counter()
print(json.dumps({"start_to_query": t_query - t0, "imports": t_imported - t0,
                  "server": t_started - t_imported, "migrate": migrated}))
"""


WARM_CHILD = r"""
import asyncio, json, resource, sys, time
def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime
t0, c0 = time.perf_counter(), cpu()
from harbor_pg import HashingEmbedder, MemoryManager
t1, c1 = time.perf_counter(), cpu()
async def main():
    manager = await MemoryManager.create(data_dir=sys.argv[1], embedder=HashingEmbedder())
    await manager.close()
asyncio.run(main())
t2, c2 = time.perf_counter(), cpu()
print(json.dumps({"import_cpu": c1 - c0, "create_cpu": c2 - c1, "cpu": c2,
                  "wall": t2 - t0, "alembic": "alembic" in sys.modules}))
"""


def server_cpu(pgdata: Path) -> float:
    """CPU seconds of the PostgreSQL processes working in ``pgdata`` so far,
    with the backends that have exited (the postmaster's reaped children)."""
    import psutil

    total = 0.0
    for proc in psutil.process_iter(["name"]):
        try:
            if "postgres" in (proc.info["name"] or "") and Path(proc.cwd()) == pgdata:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def deployed_env(env: dict[str, str], cache: Path) -> dict[str, str]:
    """``env`` for a child that starts as an installed package does: reading
    compiled bytecode (pip writes it at install), kept under ``cache`` (the
    first start writes it). Without this, where ``PYTHONDONTWRITEBYTECODE`` is
    set, every start compiles the package's 40 modules from source again
    (about 0.15 s of CPU) which no deployment pays."""
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    return env


def warm(runs: int, compare: str | None, *, source: bool = False) -> None:
    """Starts against a running, migrated embedded server (see the module doc)."""
    import os

    from harbor_pg.db import migrate, server

    med = statistics.median
    base = Path(tempfile.mkdtemp(prefix="harbor-warm-"))
    pgdata = (base / "pgdata").resolve()
    try:
        info = server.resolve_server(data_dir=base)
        migrate.upgrade(info.owner_url)
        env = dict(os.environ) if source else deployed_env(dict(os.environ), base / "pycache")
        variants = {"this": env}
        if compare:
            variants["compare"] = {**env, "PYTHONPATH": compare}
        for variant in variants.values():  # the install's compile, not counted
            subprocess.run(
                [sys.executable, "-c", "import harbor_pg.manager, harbor_pg.db.server"],
                check=True,
                env=variant,
                cwd=tempfile.gettempdir(),
            )
        got: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
        order = list(variants)
        for i in range(runs):
            for name in order if i % 2 == 0 else order[::-1]:
                s0 = server_cpu(pgdata)
                out = subprocess.run(
                    [sys.executable, "-c", WARM_CHILD, str(base)],
                    check=True,
                    capture_output=True,
                    text=True,
                    env=variants[name],
                    cwd=tempfile.gettempdir(),
                )
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row["server_cpu"] = server_cpu(pgdata) - s0
                got[name].append(row)
                print(
                    f"{name:>8} run {i + 1}: import {row['import_cpu']:.3f} s CPU, create+close"
                    f" {row['create_cpu']:.3f} s CPU, process {row['cpu']:.3f} s CPU,"
                    f" server {row['server_cpu'] * 1000:.0f} ms CPU, wall {row['wall']:.2f} s,"
                    f" alembic loaded {row['alembic']}",
                    flush=True,
                )
        print(f"\nmachine: {machine()}; medians of {runs} starts each")
        for name, rows in got.items():
            print(
                f"{name:>8}: import {med(r['import_cpu'] for r in rows):.3f} s CPU,"
                f" create()+close() {med(r['create_cpu'] for r in rows):.3f} s CPU,"
                f" whole process {med(r['cpu'] for r in rows):.3f} s CPU,"
                f" server {med(r['server_cpu'] for r in rows) * 1000:.0f} ms CPU,"
                f" wall {med(r['wall'] for r in rows):.2f} s"
            )
    finally:
        stop_embedded(pgdata)
        shutil.rmtree(base, ignore_errors=True)


def run(data: Path, mode: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(data), mode], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


QUESTION = "How long from nothing to the first answered query?"


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; ``argv`` as on the command line (``--mode`` picks the mode)."""
    # (this opening is recall.py's too, by shape: each benchmark with modes starts so)
    argv = list(sys.argv[1:] if argv is None else argv)
    if hand_off(argv, ("start", "hub"), "start", {"hub": "_startup_hub"}):
        return
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks startup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--mode",
        choices=("start", "hub"),
        default="start",
        help="start: cold start and restart (the default); hub: the default embedder "
        "facing a model hub that never answers (_startup_hub.py)",
    )
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    ap.add_argument("--warm", type=int, default=0, help="starts against a running server")
    ap.add_argument("--compare", help="another checkout to alternate with (--warm)")
    ap.add_argument(
        "--source",
        action="store_true",
        help="(--warm) no compiled bytecode: each start compiles the package from source",
    )
    args = ap.parse_args(argv)
    if args.warm:
        warm(args.warm, args.compare, source=args.source)
        return
    first, restart, migr, imports, srv = [], [], [], [], []
    for i in range(args.runs):
        data = Path(tempfile.mkdtemp(prefix="harbor-start-"))
        r1 = run(data, "migrate")
        first.append(r1["start_to_query"])
        migr.append(r1["migrate"])
        imports.append(r1["imports"])
        srv.append(r1["server"])
        stop_embedded(data / "pgdata")
        r2 = run(data, "none")
        restart.append(r2["start_to_query"])
        stop_embedded(data / "pgdata")
        shutil.rmtree(data, ignore_errors=True)
        print(
            f"run {i + 1}/{args.runs}: first start+migrate {r1['start_to_query']:.2f}s "
            f"(imports {r1['imports']:.2f}s, server start+bootstrap {r1['server']:.2f}s, "
            f"migrate {r1['migrate']:.2f}s), restart {r2['start_to_query']:.2f}s",
            flush=True,
        )
    med = statistics.median
    print(f"\nmachine: {machine()}")
    print(
        f"cold start, new data dir, to first query (incl. initdb, bootstrap, migrate, "
        f"Python imports): median {med(first):.2f}s"
    )
    print(
        f"  of which: Python imports {med(imports):.2f}s, initdb + server start + "
        f"bootstrap {med(srv):.2f}s, migrate {med(migr):.2f}s (medians)"
    )
    print(f"cold start, existing stopped data dir, to first query: median {med(restart):.2f}s")
    print(f"migration of an empty database to head: median {med(migr):.3f}s")
    if args.record:
        record(
            "startup",
            title="Start-up (`startup`)",
            data=f"{args.runs} runs, each a new data directory in a fresh subprocess",
            header=["phase", "median"],
            rows=[
                [
                    "first start to first query (initdb, bootstrap, migrate, imports)",
                    f"{med(first):.2f} s",
                ],
                ["of which: Python imports", f"{med(imports):.2f} s"],
                ["of which: initdb + server start + bootstrap", f"{med(srv):.2f} s"],
                ["of which: migrate an empty database to head", f"{med(migr):.3f} s"],
                ["restart of a stopped data directory to first query", f"{med(restart):.2f} s"],
            ],
        )


if __name__ == "__main__":
    main()
