"""``ingest --mode indexes``: what each secondary index, constraint and trigger of
the memories and their vectors costs a write, and whether recall reads it.

For each of them (the primary keys excluded: everything else keys on them),
``--rounds`` pairs in alternating order of one ``save_memories`` statement of
``--batch-size`` new memories with their vectors (a share ``--context`` with a
second one), as ``harbor_app`` with the identity set, in a transaction that is
rolled back: once with everything, once without it (an index or a constraint
dropped, a trigger disabled, inside that transaction, so nothing changes for
good; an index a constraint needs goes with that constraint). The cost is the
median of the paired differences of the statement's backend CPU time (the
server process's ``/proc/PID/schedstat``: the server runs on this machine;
wall time on a shared machine is mostly other processes' noise), per memory.
``--parts a,b``: only the parts whose names contain one of these. The HNSW graph's insert costs
milliseconds a vector and would drown the others in its noise, so it is
measured first and then left out of both sides of every other pair. Then a recall workload (hybrid,
top_k 25, owners of the store) runs and ``pg_stat_user_indexes`` says which
indexes it scanned; the store's owners are all below the exact-scan limit, so
the HNSW graph (which serves only larger owners) is not expected to be read.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

import psycopg
from psycopg.rows import dict_row

from harbor_pg.db.sqlfiles import query
from harbor_pg.db.vectors import register_vector_array
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory
from harbor_pg.tiers.long_term import MemoryVectors, _batch_params, memory_params

TABLES = ("memories", "memory_embeddings")


def _parts(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """What a write pays for, each with the statement that takes it away: the
    secondary indexes, the constraints other than primary keys, NOT NULL and
    CHECK (unique, exclusion, foreign key), the triggers."""
    rows = conn.execute(
        "select 'index ' || i.indexrelid::regclass::text as name,"
        "       'drop index ' || i.indexrelid::regclass::text || ' cascade' as drop"
        "  from pg_index i join pg_class c on c.oid = i.indrelid"
        " where c.relnamespace = 'harbor'::regnamespace and c.relname = any (%(t)s)"
        "   and not i.indisprimary"
        "   and not exists (select 1 from pg_constraint k where k.conindid = i.indexrelid"
        "                                                  and k.contype <> 'f')"
        " union all "
        "select 'constraint ' || k.conname, 'alter table ' || k.conrelid::regclass::text"
        "       || ' drop constraint ' || k.conname"
        "  from pg_constraint k join pg_class c on c.oid = k.conrelid"
        " where c.relnamespace = 'harbor'::regnamespace and c.relname = any (%(t)s)"
        "   and k.contype in ('u', 'x', 'f')"
        " union all "
        "select 'trigger ' || g.tgname, 'alter table ' || g.tgrelid::regclass::text"
        "       || ' disable trigger ' || g.tgname"
        "  from pg_trigger g join pg_class c on c.oid = g.tgrelid"
        " where c.relnamespace = 'harbor'::regnamespace and c.relname = any (%(t)s)"
        "   and not g.tgisinternal"
        " order by 1",
        {"t": list(TABLES)},
    ).fetchall()
    return {r["name"]: r["drop"] for r in rows}


def _write_once(
    conn: psycopg.Connection[Any], tenant: str, n: int, context: float, drop: list[str]
) -> float:
    from ingest import _vectors

    rng = random.Random()
    owner = MemoryOwner(tenant_id=tenant, principal_id=f"u-{tenant}")
    memories = [
        Memory(
            content=f"index cost {rng.random()} {i}",
            context="a context line" if rng.random() < context else None,
        )
        for i in range(n)
    ]
    vecs = _vectors(2 * n, rng.randrange(10**9)).tolist()
    vectors = [
        MemoryVectors(vecs[2 * i], vecs[2 * i + 1] if m.context else None)
        for i, m in enumerate(memories)
    ]
    params = _batch_params([memory_params(owner, m) for m in memories], vectors, "bench")
    pid = conn.info.backend_pid
    with conn.transaction(force_rollback=True):
        for statement in drop:
            conn.execute(statement)
        conn.execute("set local role harbor_app")
        conn.execute(
            "select harbor.set_identity(%s, principal_id => %s, is_local => true)",
            (tenant, f"u-{tenant}"),
        )
        t0 = _cpu(pid)
        conn.execute(query("save_memories"), params).fetchall()
        return _cpu(pid) - t0


def _cpu(pid: int) -> float:
    """The CPU time the server process ``pid`` has run, in seconds."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def index_costs(su: str, db_url: str, args: Any) -> None:
    from recall import tenant_name

    url = psycopg.conninfo.make_conninfo(su, dbname="harbor")
    with psycopg.connect(url, row_factory=dict_row) as conn:
        oid = conn.execute("select 'public.vector'::regtype::oid as o").fetchone()
        assert oid is not None
        register_vector_array(conn, int(oid["o"]))  # type: ignore[arg-type]
        parts = _parts(conn)
        graph = "index harbor.memory_embeddings_hnsw_384"
        if args.parts:
            wanted = args.parts.split(",")
            parts = {k: v for k, v in parts.items() if k == graph or any(w in k for w in wanted)}
        n = args.batch_size
        print(f"backend CPU per memory ({n} a statement, {args.rounds} pairs):", flush=True)
        for name in [graph, *(x for x in parts if x != graph)]:
            # the graph's insert (milliseconds a vector here) would drown the others'
            # cost in its noise: both sides of their pairs go without it
            base = [] if name == graph else [parts[graph]]
            diffs = []
            for r in range(args.rounds):
                tenant = tenant_name(random.randrange(1000))
                with_first = r % 2 == 0
                without = [*base, parts[name]]
                a = _write_once(conn, tenant, n, args.context, base if with_first else without)
                b = _write_once(conn, tenant, n, args.context, without if with_first else base)
                with_it, without_it = (a, b) if with_first else (b, a)
                diffs.append((with_it - without_it) / n)
            size = ""
            if name.startswith("index "):
                row = conn.execute(
                    "select pg_size_pretty(pg_relation_size(%s::regclass)) as s",
                    (name.removeprefix("index "),),
                ).fetchone()
                assert row is not None
                size = f"; {row['s']}"
            print(
                f"  {name}: {statistics.median(diffs) * 1e6:.0f} us a memory"
                f" (paired differences {min(diffs) * 1e6:.0f} to {max(diffs) * 1e6:.0f}){size}",
                flush=True,
            )
    asyncio.run(_recall_scans(su, db_url))


async def _recall_scans(su: str, db_url: str) -> None:
    from recall import owner_of, queries, request_for, tenant_name

    from harbor_pg.db.connection import Database
    from harbor_pg.tiers.rows import recall_in_one_round_trip

    url = psycopg.conninfo.make_conninfo(su, dbname="harbor")

    def scans() -> dict[str, int]:
        with psycopg.connect(url) as c:
            c.execute("select pg_stat_force_next_flush()")
            rows = c.execute(
                "select indexrelid::regclass::text, idx_scan from pg_stat_user_indexes"
                " where schemaname = 'harbor' and relname = any (%s)",
                (list(TABLES),),
            ).fetchall()
        return {r[0]: int(r[1] or 0) for r in rows}

    db = Database(psycopg.conninfo.make_conninfo(db_url, user="harbor_app"), max_size=1)
    await db.open()
    qs = queries(200, [(tenant_name(i), 100) for i in range(1000)], seed=5)
    time.sleep(1.0)
    before = scans()
    for tenant, text, v in qs:
        await recall_in_one_round_trip(db, owner_of(tenant), request_for(text, v, 25))
    await db.close()
    time.sleep(1.0)
    after = scans()
    print(f"index scans during {len(qs)} recalls (hybrid, top_k 25):", flush=True)
    for name in sorted(after):
        print(f"  {name}: {after[name] - before.get(name, 0)}", flush=True)
