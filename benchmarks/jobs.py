"""What queueing a turn's fact extraction costs append(), and what the queue costs a job.

    python -m benchmarks jobs [--sessions 2000] [--turns 20] [--conversations 100]
                              [--calls 2000] [--jobs 500]

On a private embedded server, as the application role with row-level security:
  * append(owner, turn) p50/p95/p99 (sessions summarised just now, so the due check
    runs and no summary starts), without extraction and with an extraction_model
    configured (the job queued in the turn's statement, left for workers:
    ``jobs_in_process=False``), in pairs: one of each back to back, which one first
    alternating, so that drift of the machine hits both alike; the ratio of the two
    p50s, and the p50 of the pairs' differences. Twice: for the turns of
    ``--conversations`` conversations going on at once (a session's extraction queued
    by its first turn waits for a worker, and the turns after it join it), and for
    turns each in a session with no extraction waiting (each one queues a job);
  * jobs per second of one worker (concurrency 1) with an instant scripted model,
    for jobs queued beforehand (a turn each, in sessions of their own);
  * the queue's overhead per job: the worker's time per job minus the time of the
    same extraction called inline (``run_session_extraction_job``), one after another.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import harbor_database, latency_row, machine, private_server, record, with_params

from harbor_pg.db import migrate, server
from harbor_pg.jobs import EXTRACT_SESSION_TASK
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage

TENANTS = 20


class InstantModel:
    """Answers at once with no facts: the job's cost is the queue's and the reads'."""

    async def generate_text(self, system: str, user: str) -> str:
        return '{"facts": []}'

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        return schema.model_validate({"facts": []})


def build(su: str, sessions: int, turns: int) -> None:
    with psycopg.connect(with_params(su, dbname="harbor"), autocommit=True) as c:
        c.execute(
            """
            insert into harbor.messages (tenant_id, user_id, session_id, principal_id, role,
                                         content, token_estimate)
            select 't' || (s %% %(tenants)s), 'u' || s, 's' || s, 'u' || s,
                   (case when i %% 2 = 0 then 'user' else 'assistant' end)::harbor.message_role,
                   'turn ' || i || ' of session ' || s || ': ' || md5(s::text || i::text), 12
              from generate_series(1, %(sessions)s) s, generate_series(1, %(turns)s) i
            """,
            {"tenants": TENANTS, "sessions": sessions, "turns": turns},
        )
        # summarised just now: an append runs the due check and starts no summary
        c.execute(
            """
            insert into harbor.session_state (tenant_id, user_id, session_id, summarised_at,
                                              turns_at_summary)
            select 't' || (s %% %(tenants)s), 'u' || s, 's' || s, now(), %(turns)s
              from generate_series(1, %(sessions)s) s
            """,
            {"tenants": TENANTS, "sessions": sessions, "turns": turns},
        )
        c.execute("vacuum analyze harbor.messages")
        c.execute("vacuum analyze harbor.session_state")


def owner_of(s: int) -> MemoryOwner:
    return MemoryOwner(tenant_id=f"t{s % TENANTS}", principal_id=f"u{s}", session_id=f"s{s}")


async def measure_append(
    su: str, sessions: int, calls: int, *, conversations: int | None = None, first: int = 1
) -> dict[str, list[float]]:
    """Paired appends with and without extraction: to random sessions of the first
    ``conversations`` (None: each pair's two turns to sessions not appended to before,
    from session ``first`` on)."""
    db = harbor_database(su)
    await db.open()
    config = MemoryManagerConfig(jobs_in_process=False)
    managers = {
        "append, no extraction": MemoryManager.from_database(db, config=config),
        "append, extraction queued": MemoryManager.from_database(
            db, config=config, extraction_model=InstantModel()
        ),
    }
    rng = random.Random(7)
    fresh = iter(range(first, sessions + 1))

    def pick() -> MemoryOwner:
        if conversations is None:
            return owner_of(next(fresh))
        return owner_of(rng.randint(1, conversations))

    out: dict[str, list[float]] = {name: [] for name in managers}
    for manager in managers.values():  # warm up the pool and the prepared statements
        for i in range(100):
            o = pick()
            await manager.append(o, ConversationMessage(role="user", content=f"warm {i}"))
    # paired: each pair is one append of each kind, back to back, the first of the pair
    # alternating, so that drift of the machine hits both alike
    pairs = list(managers.items())
    for i in range(calls):
        order = pairs if i % 2 == 0 else pairs[::-1]
        for name, manager in order:
            o = pick()
            turn = ConversationMessage(role="user", content=f"benchmark turn {i}")
            t = time.perf_counter()
            await manager.append(o, turn)
            out[name].append(time.perf_counter() - t)
    await db.close()
    return out


async def measure_worker(su: str, sessions: int, jobs: int) -> dict[str, float]:
    db = harbor_database(su)
    await db.open()
    with psycopg.connect(with_params(su, dbname="harbor"), autocommit=True) as c:
        c.execute("delete from harbor_jobs.procrastinate_jobs")
        c.execute("update harbor.owner_locks set extraction_queued = false")
    queueing = MemoryManager.from_database(
        db, config=MemoryManagerConfig(jobs_in_process=False), extraction_model=InstantModel()
    )
    rng = random.Random(11)
    appended: list[tuple[MemoryOwner, int]] = []
    for i in rng.sample(range(1, sessions + 1), jobs):  # a job each: sessions of their own
        o = owner_of(i)
        turn = await queueing.append(o, ConversationMessage(role="user", content=f"job {i}"))
        appended.append((o, int(turn.id or 0)))
    worker = MemoryManager.from_database(
        db, config=MemoryManagerConfig(jobs_in_process=False), extraction_model=InstantModel()
    )
    await worker.job_runner().open()
    t = time.perf_counter()
    await worker.run_worker(wait=False)
    queued_run = time.perf_counter() - t
    await worker.close()
    with psycopg.connect(with_params(su, dbname="harbor"), autocommit=True) as c:
        done = c.execute(
            "select count(*) from harbor_jobs.procrastinate_jobs"
            " where status = 'succeeded' and task_name = %s",
            (EXTRACT_SESSION_TASK,),
        ).fetchone()
    assert done is not None and done[0] == jobs, done
    t = time.perf_counter()
    for o, message_id in appended:
        await worker.run_session_extraction_job(o, message_id)
    inline = time.perf_counter() - t
    await db.close()
    return {
        "jobs per second (one worker)": jobs / queued_run,
        "ms per job, queued": queued_run / jobs * 1000,
        "ms per job, inline": inline / jobs * 1000,
        "queue overhead, ms per job": (queued_run - inline) / jobs * 1000,
    }


QUESTION = "What does queueing a turn's extraction cost append(), and the queue a job?"


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark; ``argv`` as on the command line."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks jobs", description=__doc__)
    ap.add_argument("--sessions", type=int, default=5000)
    ap.add_argument("--turns", type=int, default=20, help="turns per session beforehand")
    ap.add_argument(
        "--conversations", type=int, default=100, help="sessions the conversation turns go to"
    )
    ap.add_argument("--calls", type=int, default=2000, help="appends measured each way")
    ap.add_argument("--jobs", type=int, default=500, help="jobs the worker runs")
    ap.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    args = ap.parse_args(argv)
    needed = args.conversations + 2 * (args.calls + 100)
    if args.sessions < max(needed, args.jobs):
        ap.error(f"--sessions must be at least {max(needed, args.jobs)} for these --calls")
    groups = {
        "conversation turn": {"conversations": args.conversations},
        "turn queueing its session's job": {"first": args.conversations + 1},
    }
    rows: list[list[str]] = []
    summary: list[str] = []
    with private_server() as (su, _base):
        server.bootstrap(su)
        migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
        build(su, args.sessions, args.turns)
        print(f"\nmachine: {machine()}")
        for group, options in groups.items():
            appends = asyncio.run(measure_append(su, args.sessions, args.calls, **options))
            without, with_job = appends.values()
            names = [f"{group}, no extraction", f"{group}, extraction configured"]
            for name, values in zip(names, appends.values(), strict=True):
                print(f"{name:50s} p50 {statistics.median(values) * 1000:.3f} ms")
                rows.append(latency_row(name, values))
            ratio = statistics.median(with_job) / statistics.median(without)
            paired = statistics.median(q - b for b, q in zip(without, with_job, strict=True))
            print(
                f"{group}: p50 with / without {ratio:.3f}; pairs' differences p50 "
                f"{paired * 1000:.3f} ms",
                flush=True,
            )
            summary.append(
                f"{group}: p50 with extraction / without {ratio:.3f}, the pairs' "
                f"differences {paired * 1000:.3f} ms"
            )
        worker = asyncio.run(measure_worker(su, args.sessions, args.jobs))
    for name, value in worker.items():
        print(f"{name:28s} {value:.3f}")
    if args.record:
        record(
            "jobs",
            title="Extraction queued with the turn (`jobs`)",
            data=f"{args.sessions:,} sessions of {args.turns} turns, {TENANTS} tenants; "
            f"{args.calls} appends each way and kind, paired (back to back, alternating "
            f"first): turns of {args.conversations} conversations at random, and turns each "
            f"in a session of its own; {args.jobs} jobs",
            header=["call", "p50 ms", "p95 ms", "p99 ms"],
            rows=rows,
            notes="; ".join(summary) + ". One worker "
            f"(concurrency 1, an instant scripted model, no facts): "
            f"{worker['jobs per second (one worker)']:.0f} jobs/s, "
            f"{worker['ms per job, queued']:.2f} ms a job against "
            f"{worker['ms per job, inline']:.2f} ms for the same extraction called inline "
            f"(queue overhead {worker['queue overhead, ms per job']:.2f} ms a job).",
        )


if __name__ == "__main__":
    main()
