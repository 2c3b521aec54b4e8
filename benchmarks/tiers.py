"""Latency of the tiers through the Python wrapper, on the embedded server.

    python -m benchmarks tiers [--turns 1000000] [--sessions 10000] [--memories 100000]

Builds the data with server-side generate_series (as the superuser), then
times, through MemoryManager as the application role with row-level security
on and the identity set per transaction:
  * recent(owner, 12) on random sessions,
  * append(owner, turn) on random sessions summarised just now (the due check
    runs, no summary starts), and on sessions due a summary (each append
    starts a background summary that shares the loop and the pool),
  * append(owner, turn) on long sessions (--long-turns each) summarised a day
    ago, past their cooldown, a few turns short of the next summary: the due
    check asks how many turns came since that summary, counting the turns after
    its last one; and on the same kind of session after a deletion of turns,
    where it counts every turn,
  * snapshot(owner, query=..., recent_limit=12) with the long-term table filled.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import latency_row, machine, private_server, record, summary_ms, with_params

from harbor_pg.db import migrate, server
from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage

TENANTS = 100
WORDS = [
    "pipeline",
    "ingest",
    "deploy",
    "vector",
    "postgres",
    "schema",
    "budget",
    "invoice",
    "travel",
    "meeting",
    "friday",
    "report",
    "design",
    "review",
    "customer",
    "billing",
    "search",
    "index",
    "memory",
    "summary",
]


LONG_SESSIONS = 40  # half with the last summarised turn known, half after a deletion


def build(su: str, turns: int, sessions: int, memories: int, long_turns: int) -> None:
    per_session = turns // sessions
    t0 = time.perf_counter()
    with psycopg.connect(with_params(su, dbname="harbor"), autocommit=True) as c:
        c.execute(
            """
            insert into harbor.messages (tenant_id, user_id, session_id, role, content,
                                         token_estimate)
            select 't' || (s %% %(tenants)s), 'u' || s, 's' || s,
                   (case when i %% 2 = 0 then 'user' else 'assistant' end)::harbor.message_role,
                   'turn ' || i || ' of session ' || s || ': ' || md5(s::text || i::text),
                   12
              from generate_series(1, %(sessions)s) s, generate_series(1, %(per)s) i
        """,
            {"tenants": TENANTS, "sessions": sessions, "per": per_session},
        )
        t1 = time.perf_counter()
        print(f"built {sessions * per_session:,} turns in {t1 - t0:.1f}s", flush=True)
        words = "{" + ",".join(WORDS) + "}"
        c.execute(
            """
            insert into harbor.memories (tenant_id, scope, user_id, content, content_hash,
                                         importance)
            select 't' || ((n %% %(sessions)s + 1) %% %(tenants)s), 'user',
                   'u' || (n %% %(sessions)s + 1),
                   w1 || ' ' || w2 || ' note ' || n, md5(n::text) || md5((n + 1)::text),
                   (n %% 10) / 10.0
              from (select n, (%(words)s::text[])[1 + n %% 20] as w1,
                           (%(words)s::text[])[1 + (n / 20) %% 20] as w2
                      from generate_series(1, %(memories)s) n) g
        """,
            {"tenants": TENANTS, "sessions": sessions, "memories": memories, "words": words},
        )
        print(f"built {memories:,} memories in {time.perf_counter() - t1:.1f}s", flush=True)
        # steady state for the odd sessions: summarised just now, so an append there runs
        # the due check and starts nothing; the even ones (100 turns, never summarised)
        # are due, so an append there also starts a background summary
        c.execute(
            """
            insert into harbor.session_state (tenant_id, user_id, session_id, summarised_at,
                                              turns_at_summary)
            select 't' || (s %% %(tenants)s), 'u' || s, 's' || s, now(), %(per)s
              from generate_series(1, %(sessions)s, 2) s
        """,
            {"tenants": TENANTS, "sessions": sessions, "per": per_session},
        )
        # the long sessions, summarised a day ago with every turn counted: the even ones
        # know the summary's last turn, the odd ones do not (as after a deletion)
        c.execute(
            """
            insert into harbor.messages (tenant_id, user_id, session_id, role, content,
                                         token_estimate)
            select 't' || (s %% %(tenants)s), 'ul' || s, 'sl' || s,
                   (case when i %% 2 = 0 then 'user' else 'assistant' end)::harbor.message_role,
                   'turn ' || i || ' of long session ' || s, 8
              from generate_series(1, %(long)s) s, generate_series(1, %(turns)s) i
        """,
            {"tenants": TENANTS, "long": LONG_SESSIONS, "turns": long_turns},
        )
        c.execute(
            """
            insert into harbor.session_state (tenant_id, user_id, session_id, summarised_at,
                                              turns_at_summary, summarised_through)
            select 't' || (s %% %(tenants)s), 'ul' || s, 'sl' || s, now() - interval '1 day',
                   %(turns)s,
                   case when s %% 2 = 0 then
                       (select max(m.id) from harbor.messages m
                         where m.tenant_id = 't' || (s %% %(tenants)s)
                           and m.user_id = 'ul' || s and m.session_id = 'sl' || s) end
              from generate_series(1, %(long)s) s
        """,
            {"tenants": TENANTS, "long": LONG_SESSIONS, "turns": long_turns},
        )
        c.execute("vacuum analyze harbor.messages")
        c.execute("vacuum analyze harbor.memories")


async def measure(app_url: str, sessions: int, n: int, long_turns: int) -> dict[str, list[float]]:
    db = Database(app_url, min_size=1, max_size=2)
    await db.open()
    manager = MemoryManager.from_database(db)
    rng = random.Random(7)

    def owner(parity: int | None = None) -> MemoryOwner:
        s = rng.randint(1, sessions)
        if parity is not None and s % 2 != parity:
            s = s + 1 if s < sessions else s - 1
        return MemoryOwner(
            tenant_id=f"t{s % TENANTS}", principal_id=f"u{s}", session_id=f"s{s}", run_id="r1"
        )

    out: dict[str, list[float]] = {
        "recent": [],
        "append": [],
        "append, summary due": [],
        f"append, {long_turns:,}-turn session, summary's last turn known": [],
        f"append, {long_turns:,}-turn session, after a deletion": [],
        "snapshot": [],
    }
    for _ in range(50):  # warm up the pool and the driver's prepared statements
        await manager.recent(owner(), 12)
        await manager.snapshot(owner(), query="deploy pipeline", recent_limit=12)
    for _ in range(n):
        o = owner()
        t = time.perf_counter()
        got = await manager.recent(o, 12)
        out["recent"].append(time.perf_counter() - t)
        assert len(got) == 12
    for i in range(n):
        o = owner(parity=1)  # summarised just now: the due check says no
        t = time.perf_counter()
        await manager.append(o, ConversationMessage(role="user", content=f"benchmark turn {i}"))
        out["append"].append(time.perf_counter() - t)
    await manager.drain()
    for i in range(n):
        # never summarised, 100 turns: this append starts a background summary, which
        # then shares the event loop and the two-connection pool with the next appends
        o = owner(parity=0)
        t = time.perf_counter()
        await manager.append(o, ConversationMessage(role="user", content=f"benchmark turn {i}"))
        out["append, summary due"].append(time.perf_counter() - t)
    await manager.drain()
    # the long sessions: each gets at most ten of these appends (the next summary is
    # min_turns, 20, away), in turn, so none becomes due
    calls = min(n, 10 * LONG_SESSIONS // 2)
    for parity, name in (
        (0, f"append, {long_turns:,}-turn session, summary's last turn known"),
        (1, f"append, {long_turns:,}-turn session, after a deletion"),
    ):
        for i in range(calls):
            s = 2 * (i % (LONG_SESSIONS // 2)) + 2 - parity
            o = MemoryOwner(tenant_id=f"t{s % TENANTS}", principal_id=f"ul{s}", session_id=f"sl{s}")
            t = time.perf_counter()
            await manager.append(o, ConversationMessage(role="user", content=f"long turn {i}"))
            out[name].append(time.perf_counter() - t)
    await manager.drain()
    for _ in range(n):
        o = owner()
        t = time.perf_counter()
        snap = await manager.snapshot(o, query=rng.choice(WORDS) + " notes", recent_limit=12)
        out["snapshot"].append(time.perf_counter() - t)
        assert len(snap.recent) == 12
    await db.close()
    return out


QUESTION = "What does each tier's call cost through the Python wrapper?"


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; ``argv`` as on the command line."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks tiers", description=__doc__)
    ap.add_argument("--turns", type=int, default=1_000_000)
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--memories", type=int, default=100_000)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--long-turns", type=int, default=5000, help="turns of each long session")
    ap.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    args = ap.parse_args(argv)
    with private_server() as (su, _base):
        server.bootstrap(su)
        migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
        build(su, args.turns, args.sessions, args.memories, args.long_turns)
        res = asyncio.run(
            measure(
                with_params(su, dbname="harbor", user="harbor_app"),
                args.sessions,
                args.calls,
                args.long_turns,
            )
        )
    print(f"\nmachine: {machine()}")
    print(
        f"data: {args.turns:,} turns in {args.sessions:,} sessions, {args.memories:,} "
        f"memories, {TENANTS} tenants; {LONG_SESSIONS} sessions of {args.long_turns:,} turns"
    )
    for name, values in res.items():
        print(f"{name:20s} {summary_ms(values)}")
    if args.record:
        record(
            "tiers",
            title="Tier calls through the wrapper (`tiers`)",
            data=f"{args.turns:,} turns in {args.sessions:,} sessions, {args.memories:,}"
            f" memories, {TENANTS} tenants, and {LONG_SESSIONS} sessions of"
            f" {args.long_turns:,} turns; {args.calls} calls each"
            f" ({min(args.calls, 10 * LONG_SESSIONS // 2)} on the long sessions)",
            header=["call", "p50 ms", "p95 ms", "p99 ms"],
            rows=[latency_row(name, values) for name, values in res.items()],
        )


if __name__ == "__main__":
    main()
