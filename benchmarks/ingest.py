"""Ingest: memories/s through the API into a store already holding 100,000.

    python -m benchmarks ingest [--preload 100000] [--rounds 6] [--batches 8]
                                [--batch-size 256] [--singles 300] [--context 0.25]
                                [--ref COMMIT] [--data-dir DIR] [--record]
    python -m benchmarks ingest --mode indexes ...   (what each index costs a write)

The store: ``--preload`` USER memories of 1,000 owners with 384-dimension
vectors (``benchmarks/recall.py``'s data, written round robin by COPY, the
indexes built afterwards), kept under ``--data-dir`` and reused. Every write
below adds new memories to it (the store grows by what the runs wrote).

Writes go through ``MemoryManager`` as ``harbor_app`` under row-level
security with the identity set, vectors given (precomputed, the embedder a
lookup), to random owners among the 1,000:

* ``batch``: ``save_many`` of ``--batch-size`` memories a call (one owner each
  call, one transaction a call), memories/s;
* ``single``: ``save(embedding=...)``, one memory a call, memories/s and p50/p99.

A share ``--context`` of the memories carry a context line, and so two
vectors. Each run (rounds of batch then single) is timed on one pool of 4
connections, one call at a time.

``--ref COMMIT`` compares the library at COMMIT with this checkout on the
same server, round by round (A, B, B, A, ...): each side is a worker process
of its own whose ``harbor_pg`` comes from its tree (COMMIT's from ``git
archive``); the schema is this checkout's. Reported: each side's median
memories/s over the rounds and the ratio B/A (the machine is shared: compare
ratios, not absolute figures). With ``--ref-schema`` the ref side writes to a
database of its own on the same server (``harbor_ref``, kept): a copy of the
preloaded store taken down to COMMIT's newest revision by this checkout's
migrations, then migrated by COMMIT's code, so that a schema change (an index,
a column) is compared as well.

``--mode indexes``: for each secondary index, constraint (unique, exclusion,
foreign key) and trigger of the two tables, the time of one ``save_many``-sized
write (``--batch-size`` memories with their vectors, as the library's statement
does it) with it and without it (dropped or disabled in a transaction that is
rolled back, so nothing changes), paired, as the superuser acting as
``harbor_app``; plus whether a recall workload (small and large owners, hybrid)
scans each index (``pg_stat_user_indexes``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent
MODEL = "bench"
DIMS = 384
OWNERS = 1000


# -- the worker: one side of the comparison, in a process of its own ------------------


def _words(rng: random.Random, n: int) -> str:
    from recall import vocabulary

    vocab = _words.vocab = getattr(_words, "vocab", None) or vocabulary()  # type: ignore[attr-defined]
    topic = vocab[rng.randrange(len(vocab))]
    return " ".join(rng.choice(topic) for _ in range(n))


def _vectors(n: int, seed: int) -> np.ndarray:
    from recall import centres

    rng = np.random.default_rng(seed)
    cen = centres()
    v = cen[rng.integers(0, len(cen), n)] + rng.standard_normal((n, DIMS)).astype(np.float32) * 0.08
    return v / np.linalg.norm(v, axis=1, keepdims=True)


class _Lookup:
    """An embedder that returns the vectors prepared for each text (no model runs)."""

    model_id = MODEL
    dimensions = DIMS
    relevance_threshold = 0.5

    def __init__(self) -> None:
        self.table: dict[str, list[float]] = {}

    async def embed(self, texts: Any) -> list[list[float]]:
        return [self.table[t] for t in texts]

    async def embed_query(self, text: str) -> list[float]:
        return self.table[text]


def _workload(seed: int, count: int, context_share: float) -> list[tuple[Any, list[float], Any]]:
    """``count`` new memories (memory, content vector, context vector or None)."""
    from harbor_pg.records import Memory

    rng = random.Random(seed)
    vecs = _vectors(2 * count, seed).tolist()
    out = []
    for i in range(count):
        content = f"{_words(rng, 8)} (note {seed}-{i})"
        context = f"{_words(rng, 4)} context" if rng.random() < context_share else None
        out.append(
            (
                Memory(content=content, context=context),
                vecs[2 * i],
                vecs[2 * i + 1] if context else None,
            )
        )
    return out


async def _worker(app_url: str) -> None:
    from recall import owner_of, tenant_name

    from harbor_pg import MemoryManager
    from harbor_pg.db.connection import Database

    db = Database(app_url, min_size=4, max_size=4)
    await db.open()
    embedder = _Lookup()
    manager = MemoryManager.from_database(db, embedder=embedder)  # type: ignore[arg-type]
    owners = [owner_of(tenant_name(i)) for i in range(OWNERS)]
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(json.dumps({"ready": True}), flush=True)
    while line := await reader.readline():
        job = json.loads(line)
        rng = random.Random(job["seed"])
        out: dict[str, Any] = {}
        if job["batches"]:
            n = job["batch_size"]
            work = [
                (rng.choice(owners), _workload(job["seed"] * 1000 + b, n, job["context"]))
                for b in range(job["batches"])
            ]
            for _, items in work:
                for memory, vec, cvec in items:
                    embedder.table[memory.content] = vec
                    if cvec is not None:
                        from harbor_pg.context.recall import embedding_texts

                        embedder.table[embedding_texts(memory)[1]] = cvec
            t0 = time.perf_counter()
            created = 0
            for owner, items in work:
                results = await manager.save_many(
                    owner, [m for m, _, _ in items], batch_size=len(items)
                )
                created += sum(r.created for r in results)
            wall = time.perf_counter() - t0
            assert created == n * job["batches"], created
            out["batch_s"] = n * job["batches"] / wall
            embedder.table.clear()
        if job["singles"]:
            items = _workload(job["seed"] * 1000 + 999, job["singles"], job["context"])
            lat = []
            t0 = time.perf_counter()
            for memory, vec, cvec in items:
                owner = rng.choice(owners)
                s0 = time.perf_counter()
                if cvec is None:
                    r = await manager.save(owner, memory, embedding=vec, model_id=MODEL)
                else:
                    r = await _save_with_context(manager, owner, memory, vec, cvec)
                lat.append(time.perf_counter() - s0)
                assert r.created
            wall = time.perf_counter() - t0
            out["single_s"] = len(items) / wall
            out["single_ms"] = [x * 1000 for x in lat]
        print(json.dumps(out), flush=True)
    await manager.close()
    await db.close()


async def _save_with_context(manager: Any, owner: Any, memory: Any, vec: Any, cvec: Any) -> Any:
    """One memory with a context and both vectors, one call (the store's ``save``: the
    manager's ``save`` takes one given vector)."""
    store = manager._long()
    return await store.save(owner, memory, vec, MODEL, context_embedding=cvec)


# -- the parent: the store, the rounds, the report ------------------------------------


def _kept_store(data_dir: Path, preload: int) -> Path:
    return data_dir / f"ingest-{preload}"


def _start_worker(tree: Path, app_url: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=f"{tree}:{ROOT / 'benchmarks'}")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--worker", app_url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
    )
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline()) == {"ready": True}
    return proc


def _ask(proc: subprocess.Popen[str], job: dict[str, Any]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(job) + "\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"a worker stopped (exit {proc.wait()})")
    result: dict[str, Any] = json.loads(line)
    return result


def _tree_of(ref: str, into: Path) -> Path:
    """``ref``'s tree of the repository, extracted into ``into``."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", ref], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    # the wheel's harbor_pg._sql and harbor_pg._migrations (an editable install maps
    # them to this checkout's directories, which the ref side must not read)
    (into / "harbor_pg" / "_sql").symlink_to(into / "sql")
    (into / "harbor_pg" / "_migrations").symlink_to(into / "migrations")
    return into


def _preloaded(su: str, preload: int, dbname: str = "harbor") -> None:
    from recall import build, tenant_name

    with psycopg.connect(psycopg.conninfo.make_conninfo(su, dbname=dbname)) as conn:
        have = conn.execute("select count(*) from harbor.memories").fetchone()
    if have and have[0] >= preload:
        return
    per = preload // OWNERS
    print(f"  writing {preload:,} memories over {OWNERS} owners into {dbname} (once, kept)")
    seconds = build(su, [(tenant_name(i), per) for i in range(OWNERS)], "interleaved", dbname)
    print(f"  written in {seconds:.0f}s", flush=True)


def _ref_database(su: str, ref_tree: Path) -> str:
    """The ref side's database, ``harbor_ref`` (kept): made once as a copy of the
    preloaded ``harbor`` database, taken down to the ref's newest revision by this
    checkout's migrations (the ref must be an ancestor), and then migrated by the
    ref's own code (which applies its functions); returns its application URL."""
    from _common import with_params

    from harbor_pg.db import migrate, server

    ref_db = with_params(su, dbname="harbor_ref")
    owner = with_params(ref_db, user=server.OWNER_ROLE)
    env = dict(os.environ, PYTHONPATH=str(ref_tree))

    def in_ref(code: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", code, owner],
            env=env,
            cwd=tempfile.gettempdir(),
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    with psycopg.connect(su, autocommit=True) as conn:
        have = conn.execute("select 1 from pg_database where datname = 'harbor_ref'").fetchone()
        if have:  # kept, unless it holds fewer memories than the store (a broken copy)
            with psycopg.connect(with_params(su, dbname="harbor_ref")) as ref:
                row = ref.execute("select count(*) from harbor.memories").fetchone()
            with psycopg.connect(with_params(su, dbname="harbor")) as main_db:
                total = main_db.execute("select count(*) from harbor.memories").fetchone()
            if not row or not total or row[0] < total[0] // 2:
                conn.execute("drop database harbor_ref")
                have = None
        if not have:
            print("  copying the preloaded store for the ref side (once, kept)", flush=True)
            conn.execute("create database harbor_ref template harbor")
    if not have:
        head = in_ref("from harbor_pg.db import migrate; print(migrate.head_revision())")
        t0 = time.perf_counter()
        migrate.downgrade(owner, head)
        print(f"  harbor_ref taken down to {head} in {time.perf_counter() - t0:.0f}s", flush=True)
    in_ref("import sys; from harbor_pg.db import migrate; migrate.upgrade(sys.argv[1])")
    return with_params(ref_db, user=server.APP_ROLE)


def _report(name: str, sides: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    rows = []
    for label, results in sides.items():
        batch = [r["batch_s"] for r in results if "batch_s" in r]
        single = [r["single_s"] for r in results if "single_s" in r]
        lat = [x for r in results for x in r.get("single_ms", [])]
        from _common import pct

        rows.append(
            [
                label,
                f"{statistics.median(batch):,.0f}" if batch else "-",
                f"{statistics.median(single):,.0f}" if single else "-",
                f"{statistics.median(lat):.2f} / {pct(lat, 99):.2f}" if lat else "-",
                f"{min(batch):,.0f}-{max(batch):,.0f}" if batch else "-",
            ]
        )
    print(f"{name}:")
    print(
        "  side | save_many memories/s (median) | save memories/s | save p50/p99 ms | batch range"
    )
    for row in rows:
        print("  " + " | ".join(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["--worker"]:
        asyncio.run(_worker(args_list[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["rate", "indexes"], default="rate")
    parser.add_argument("--preload", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--singles", type=int, default=300)
    parser.add_argument("--context", type=float, default=0.25)
    parser.add_argument("--ref", help="compare with the library at this commit")
    parser.add_argument(
        "--ref-schema",
        action="store_true",
        help="with --ref: the ref side writes to a database of its own (harbor_ref, kept),"
        " migrated by the ref's migrations and preloaded the same way, so that a schema"
        " change is compared too",
    )
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument(
        "--parts", help="with --mode indexes: only the parts whose names contain one of these"
    )
    parser.add_argument("--record", action="store_true")
    args = parser.parse_args(args_list)

    from _common import data_home, kept_server, machine, with_params

    from harbor_pg.db import migrate, server

    base = _kept_store(args.data_dir or data_home(), args.preload)
    print(f"machine: {machine()}", flush=True)
    with kept_server(base) as (su, _):
        server.bootstrap(su)
        db_url = with_params(su, dbname=server.DATABASE)
        migrate.upgrade(with_params(db_url, user=server.OWNER_ROLE))
        _preloaded(su, args.preload)
        app_url = with_params(db_url, user=server.APP_ROLE)
        if args.mode == "indexes":
            from _ingest_indexes import index_costs

            index_costs(su, db_url, args)
            return
        work = tempfile.mkdtemp(prefix="harbor-ingest-")
        try:
            ref_url = app_url
            if args.ref:
                ref_tree = _tree_of(args.ref, Path(work))
                if args.ref_schema:
                    ref_url = _ref_database(su, ref_tree)
            sides = {"this checkout": _start_worker(ROOT, app_url)}
            if args.ref:
                sides = {f"ref {args.ref}": _start_worker(ref_tree, ref_url), **sides}
            results: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
            names = list(sides)
            for r in range(args.rounds):
                order = names if r % 2 == 0 else names[::-1]
                for name in order:
                    job = {
                        "seed": 10_000 * (r + 1) + names.index(name) + 1 + random.randrange(10**6),
                        "batches": args.batches,
                        "batch_size": args.batch_size,
                        "singles": args.singles,
                        "context": args.context,
                    }
                    results[name].append(_ask(sides[name], job))
                    last = results[name][-1]
                    print(
                        f"  round {r + 1} {name}: save_many {last.get('batch_s', 0):,.0f}/s,"
                        f" save {last.get('single_s', 0):,.0f}/s",
                        flush=True,
                    )
            rows = _report("ingest", results)
            notes = []
            if args.ref and len(names) == 2:
                a, b = (results[n] for n in names)
                for key, label in (("batch_s", "save_many"), ("single_s", "save")):
                    ratios = [y[key] / x[key] for x, y in zip(a, b, strict=True) if key in x]
                    if ratios:
                        print(f"  {key}: B/A median ratio {statistics.median(ratios):.2f}")
                        notes.append(
                            f"{label}: this checkout / ref {args.ref}, median of the paired"
                            f" rounds: {statistics.median(ratios):.2f}"
                        )
            notes.append(
                f"load average at the end: {os.getloadavg()[0]:.1f} on"
                f" {os.cpu_count()} cores (absolute figures are inflated by load)"
            )
            for proc in sides.values():
                assert proc.stdin is not None
                proc.stdin.close()
                proc.wait(timeout=60)
            if args.record:
                from _common import record

                record(
                    "ingest",
                    title="Ingest (`ingest`)",
                    data=f"{args.preload:,} memories preloaded over {OWNERS} owners, 384-d",
                    header=["side", "save_many /s", "save /s", "save p50/p99 ms", "range"],
                    rows=rows,
                    notes="; ".join(notes) + ".",
                )
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
