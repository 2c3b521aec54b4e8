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
measured first and then left out of both sides of every other pair. Then each
kind of call the facade makes (recall, search, save, the current memories, a profile,
a history, a consolidation's dry run, the expiry sweep, erasure, and recall for one
owner of 5,200 turns that share a speaker's name, whose lexical leg matches through the
owner-term index above 2,000 rows and whose dense leg walks the graph, and for one of
1,500, whose lexical leg reads the owner's rows from the covering index when a
question's word is in many of them but not in nearly all) runs, and
``pg_stat_user_indexes`` says which indexes each read. The calls that write do it for
users of their own, erased at the end: the kept store is the same after the run.
``--record``: the costs and the reads, as the section of RESULTS.md.
"""

from __future__ import annotations

import asyncio
import random
import re
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
        # (the sizes before this run's rolled-back writes, which leave dead entries)
        sizes = {
            name: _size(conn, name.removeprefix("index "))
            for name in parts
            if name.startswith("index ")
        }
        n = args.batch_size
        costs: list[tuple[str, str]] = []
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
            cost = f"{_us(statistics.median(diffs))} us ({_us(min(diffs))} to {_us(max(diffs))})"
            costs.append((name, cost))
            print(f"  {name}: {cost}; {sizes.get(name, '')}", flush=True)
    read = asyncio.run(_recall_scans(su, db_url))
    if args.record:
        _record(args, costs, sizes, read)


def _us(seconds: float) -> str:
    """Seconds as whole microseconds (never "-0")."""
    return str(round(seconds * 1e6))


def _size(conn: psycopg.Connection[Any], index: str) -> str:
    row = conn.execute(
        "select pg_size_pretty(pg_relation_size(%s::regclass)) as s", (index,)
    ).fetchone()
    assert row is not None
    return str(row["s"])


# what each constraint and trigger is for (no index scan reads them: every write they
# fire on pays for them)
PURPOSE = {
    "memories_superseded_by_fkey": "supersession's link to the successor",
    "memory_embeddings_memory_fkey": "a vector's memory; erasure's cascade to the vectors",
    "memories_add_only": "the add-only rule (a write may only close a row)",
    "memories_announce_insert": "change notifications (once a statement)",
    "memories_announce_update": "change notifications (fires on an update, not here)",
    "memories_announce_delete": "change notifications (fires on a delete, not here)",
    "memories_context_hash": "the context's key, which recall's neighbour signal reads",
    "memories_provenance": "provenance names the writer (erasure of a user's sessions)",
    "memories_summary_id": "a rolling summary's id is its owner's",
    "memories_superseded_by_visible": "a successor is a memory the writer can see",
    "memory_embeddings_owner": "a vector's owner is its memory's (the dense leg's filter)",
}


def _record(
    args: Any,
    costs: list[tuple[str, str]],
    sizes: dict[str, str],
    read: dict[str, dict[str, int]],
) -> None:
    """The section of RESULTS.md: each part's cost a memory and the calls that read it
    (an index's scans; a constraint or trigger is paid by every write, read by none)."""
    from _common import record
    from ingest import OWNERS

    rows = []
    unread = []
    for name, cost in costs:
        kind, _, part = name.partition(" ")
        by = PURPOSE.get(part, "")
        if kind == "index":
            scans = [f"{label} {count[part]:,}" for label, count in read.items() if count.get(part)]
            by = ", ".join(scans) or "none"
            if not scans:
                unread.append(part.removeprefix("harbor."))
        rows.append([f"{kind} `{part.removeprefix('harbor.')}`", cost, sizes.get(name, ""), by])
    graph = "the HNSW graph measured alone, then left out of both sides of every other pair"
    record(
        "ingest",
        title="Ingest (`ingest`), and what each part of a write costs (`ingest --mode indexes`)",
        data=(
            f"{args.preload:,} memories preloaded over {OWNERS:,} owners, 384-d,"
            f" {args.context:.0%} with a context (two vectors); one {args.batch_size}-memory"
            " `save_memories` as `harbor_app` in a rolled-back transaction, with and without"
            " each part (dropped or disabled in that transaction), backend CPU of the statement"
            f" (`/proc` schedstat), median of {args.rounds} paired rounds, {graph}; then the"
            " index scans (`pg_stat_user_indexes`) of each kind of facade call, with an owner"
            " of 1,500 and one of 5,200 turns that name one speaker"
        ),
        header=[
            "part",
            "a memory (paired range)",
            "size",
            "read by (index scans; the calls in brackets) or what it keeps",
        ],
        rows=rows,
        notes=_unread_note(unread),
    )


async def _recall_scans(su: str, db_url: str) -> dict[str, dict[str, int]]:
    """Which indexes each kind of call reads: the index scans (``pg_stat_user_indexes``)
    during a run of each, through the facade, on owners of the store. An index that no
    kind reads (nor a constraint: the unique ones are read by every insert) is one a
    write pays for and nothing uses."""
    from recall import owner_of, queries, request_for, tenant_name

    from harbor_pg.db.connection import Database
    from harbor_pg.embedders.hashing import HashingEmbedder
    from harbor_pg.manager import MemoryManager
    from harbor_pg.owner import MemoryOwner
    from harbor_pg.records import Memory
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

    db = Database(
        psycopg.conninfo.make_conninfo(db_url, user="harbor_app"),
        psycopg.conninfo.make_conninfo(db_url, user="harbor_admin"),
        min_size=1,
        max_size=1,
    )
    await db.open()
    manager = MemoryManager.from_database(db, embedder=HashingEmbedder())
    qs = queries(200, [(tenant_name(i), 100) for i in range(1000)], seed=5)
    rng = random.Random(11)
    owners = [owner_of(tenant_name(i)) for i in rng.sample(range(1000), 60)]

    async def recall() -> None:
        for tenant, text, v in qs:
            await recall_in_one_round_trip(db, owner_of(tenant), request_for(text, v, 25))

    async def search() -> None:
        for tenant, text, _v in qs[:100]:
            await manager.search(owner_of(tenant), text, limit=25)

    # the calls that write do it for users of their own, erased at the end, so that the
    # kept store is the same after the run
    writers = [
        MemoryOwner(tenant_id=owner.tenant_id, principal_id=f"u-probe-{k}")
        for k, owner in enumerate(owners)
    ]

    async def save() -> None:
        for k, owner in enumerate(writers):
            await manager.save(owner, Memory(content=f"a fact saved to look at index reads {k}"))

    async def current() -> None:
        for owner in owners[:30]:
            await manager.current_memories(owner)

    async def profile() -> None:
        for owner in owners[:30]:
            await manager.profile(owner)

    async def history() -> None:
        for owner in writers[:30]:
            found = await manager.search(owner, "index reads", limit=1)
            if found and found[0].id is not None:
                await manager.history(owner, found[0].id)

    async def consolidate() -> None:
        for owner in owners[:10]:
            await manager.consolidate(owner, dry_run=True)

    async def expire() -> None:
        await manager.expire_memories()

    async def erase() -> None:
        for owner in [talker, chatter, *writers]:
            await manager.erase(owner.tenant_id, user_id=owner.user_id)

    # one owner of a conversation's size and more: 5,200 turns that all name the same
    # speaker (the lexical leg's term lookup then finds too many matches and reads the
    # owner's rows; above 2,000 rows it matches through the text index; above 5,000
    # vectors the dense leg walks the graph)
    talker = MemoryOwner(tenant_id=tenant_name(0), principal_id="u-talker")
    topics = ["garden", "budget", "trip", "dinner", "concert", "hiking", "paint", "job"]
    for start in range(0, 5200, 400):
        await manager.save_many(
            talker,
            [
                Memory(content=f"Caroline: turn {k} about the {topics[k % 8]} and {k % 97}")
                for k in range(start, min(start + 400, 5200))
            ],
        )

    # and one of a conversation's size: 1,500 turns (its lexical leg reads the owner's
    # rows from the covering index when a question's word is in many of them but not
    # in nearly all)
    chatter = MemoryOwner(tenant_id=tenant_name(0), principal_id="u-chatter")
    await manager.save_many(
        chatter,
        [
            Memory(content=f"Melanie: turn {k} about the {topics[k % 8]} and {k % 89}")
            for k in range(1500)
        ],
    )

    async def talk() -> None:
        for k in range(20):
            # with the speaker's name (in every row) and without it
            name = "Caroline " if k % 2 else ""
            await manager.recall(talker, f"what did {name}say about the {topics[k % 8]}?")

    async def chat() -> None:
        for k in range(20):
            # with the speaker's name (in every row: only the rows holding the topic are
            # read, from the owner-term index) and without it (the topic is in an eighth
            # of the rows, more than the term lookup reads: the owner's rows are read
            # from the covering index)
            name = "Melanie " if k % 2 else ""
            await manager.recall(chatter, f"what did {name}say about the {topics[k % 8]}?")

    kinds = [
        (f"recall ({len(qs)})", recall),
        ("recall, an owner of 5,200 turns (20)", talk),
        ("recall, an owner of 1,500 turns (20)", chat),
        ("search (100)", search),
        (f"save ({len(owners)})", save),
        ("current (30)", current),
        ("profile (30)", profile),
        ("history (30)", history),
        ("consolidate, dry run (10)", consolidate),
        ("expire (1)", expire),
        (f"erase a user ({len(writers) + 2})", erase),
    ]

    async def flushed() -> dict[str, int]:
        # a backend reports its statistics when it goes idle, at most once a second
        # unless told to: each pooled connection (the application's one, the elevated
        # pool's two) is told to, and goes idle, before they are read
        async with db.transaction(None) as conn:
            await conn.execute("select pg_stat_force_next_flush()")
        # (the elevated pool's two connections, both held at once)
        async with (
            db.transaction(None, admin=True) as one,
            db.transaction(None, admin=True) as two,
        ):
            await one.execute("select pg_stat_force_next_flush()")
            await two.execute("select pg_stat_force_next_flush()")
        time.sleep(0.3)
        return scans()

    read: dict[str, dict[str, int]] = {}
    for label, work in kinds:
        before = await flushed()
        await work()
        after = await flushed()
        read[label] = {name: after[name] - before.get(name, 0) for name in after}
    await manager.close()
    await db.close()
    print("index scans by kind of call (through the facade):", flush=True)
    for name in sorted(read[kinds[0][0]]):
        by = [f"{label} {read[label][name]}" for label, _ in kinds if read[label].get(name)]
        print(f"  {name}: {', '.join(by) or 'none'}", flush=True)
    return read


def _unread_note(unread: list[str]) -> str:
    """Which indexes no call of the run read, and why each stays."""
    graphs = [u for u in unread if re.fullmatch(r"memory_embeddings_hnsw_\d+", u)]
    others = [u for u in unread if u not in graphs]
    lines = [
        "`memories_lexical_idx` (+ `_rest_idx`) are read by one path: the lexical leg's"
        " pass over an owner's rows (up to 2,000 of them), taken when a question's term is"
        " in more rows than the term lookup reads and none is in 90% of them (here the"
        " 1,500-turn owner's questions without the speaker's name)."
    ]
    if graphs:
        lines.append(
            "Not read by any call of this run: "
            + ", ".join(f"`{u}`" for u in graphs)
            + ", the graph of another dimension's vectors (the dense leg walks it for an"
            " owner above `graph_min_vectors()` of an embedder of that dimension; this"
            " store's are 384-d): it stays."
        )
    if others:
        lines.append("Read by no call of this run: " + ", ".join(f"`{u}`" for u in others) + ".")
    return " ".join(lines)
