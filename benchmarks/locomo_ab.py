"""Recall speed on LoCoMo text, old and new recall SQL side by side, paired.

    python benchmarks/locomo_ab.py PATH/locomo-dev.json --cache DIR [--ref COMMIT]
                                   [--modes hybrid,lexical,dense] [--rounds 1] [--keep DIR]
                                   [--record]

Whole runs of ``benchmarks/locomo.py`` on a shared machine differ by more
than most changes are worth. This one ingests the dev conversations once, as
``benchmarks/locomo.py`` does (one owner per conversation, each turn valid
from its session's date with the preceding turn as its context, the vectors
from the cache in ``DIR``, copied first so that the cache is only read), then
installs ``COMMIT``'s recall functions beside the current ones under ``_ab``
names (``benchmarks/_recall_ab.py``) and answers every question with both, in
alternating order, through the library's one-round-trip path on one pooled
connection: the shipped defaults, top_k 25, no relevance floor, "now" an
hour after the conversation's last session.

It prints, per mode, each side's p50 and p95 as the client sees it, the median
of the paired differences, the server process's CPU time per call (its
on-CPU time from ``/proc/PID/schedstat``, which waiting for a core on a
shared machine does not inflate), each side's mean time inside the server
(``track_functions``, all modes together), how many answers were identical (ids, ranks, scores to
12 digits), and each side's R@5/10/25 (which must not move for a change meant
to be only faster). ``--ref HEAD`` is the noise floor. ``--record`` writes
the per-mode table into benchmarks/RESULTS.md's ``locomo-ab`` section.

R@k is scored as ``benchmarks/locomo.py`` scores it (``turns_found``,
``recall_of``): a turn repeated word for word later in its conversation is
stored once, as the first copy, and counts as found when that memory is among
the top k; k counts recalled memories, not turn ids. A conversation with such
repeats adds their count per conversation and in total to the output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import psycopg
from _common import RESULTS, kept_server, machine, private_server, record, with_params
from _embed_cache import CachedEmbedder
from _recall_ab import drop_ab, install, old_functions, old_query, server_times
from locomo import (
    DEFAULT_MODEL,
    KS,
    evidence_of,
    recall_of,
    repeats_of,
    repeats_summary,
    turn_memories,
    turns_found,
    turns_of,
)

from harbor_pg.context.recall import MemoryRecall
from harbor_pg.db import migrate, server
from harbor_pg.db.connection import Database
from harbor_pg.db.sqlfiles import query as sql_query
from harbor_pg.embedders.fastembed import FastEmbedEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.tiers.rows import recall_params

MODES = ("hybrid", "lexical", "dense")


def _on_cpu(pid: int) -> float:
    """Seconds the server process ``pid`` has spent on a CPU (the scheduler's
    count, /proc/PID/schedstat): unlike the wall clock, not inflated by waiting
    for a core on a shared machine. 0 where it cannot be read."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _answer(rows: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (r["id"], r["rank"], round(r["score"], 12), r["dense_rank"], r["lexical_rank"])
        for r in rows
    ]


async def run(args: argparse.Namespace, su: str, cache: Path, keep: Path | None) -> list[list[str]]:
    data = json.loads(Path(args.path).read_text())
    if args.only:
        data = [s for s in data if s["sample_id"] in args.only.split(",")]
    embedder = CachedEmbedder(
        FastEmbedEmbedder(model_path=args.model_path, model_id="minilm-l6-int8"), cache
    )
    app_url = with_params(su, dbname="harbor", user="harbor_app")
    db = Database(
        app_url, with_params(su, dbname="harbor", user="harbor_admin"), min_size=1, max_size=1
    )
    await db.open()
    manager = MemoryManager.from_database(db, embedder=embedder)
    policy = MemoryPolicy(recall_top_k=25, relevance_threshold=0.0)
    recaller = MemoryRecall(policy=policy, memories=manager.long_term, embedder=embedder)
    modes = [m for m in args.modes.split(",") if m]
    # every question of every conversation: (owner, params per mode, evidence, dia_of)
    work: list[tuple[MemoryOwner, dict[str, dict[str, Any]], set[str], dict[str, list[str]]]] = []
    n_turns = n_cited = 0
    repeats: dict[str, list[tuple[str, str]]] = {}
    marker = keep / "locomo-ingested.json" if keep else None
    known: dict[str, dict[str, list[str]]] = (
        json.loads(marker.read_text()) if marker and marker.exists() else {}
    )
    for sample in data:
        owner = MemoryOwner(tenant_id="locomo", principal_id=sample["sample_id"])
        turns = turns_of(sample)
        n_turns += len(turns)
        dia_of: defaultdict[str, list[str]]
        if sample["sample_id"] in known:
            dia_of = defaultdict(list, known[sample["sample_id"]])
        else:
            results = await manager.save_many(
                owner, turn_memories(sample, turns, context=True), batch_size=64
            )
            dia_of = defaultdict(list)
            for turn, res in zip(turns, results, strict=True):
                assert res.memory.id is not None
                dia_of[res.memory.id].append(turn.dia_id)
            known[sample["sample_id"]] = dict(dia_of)
        repeats[sample["sample_id"]] = repeats_of([t.dia_id for t in turns], dia_of)
        repeated = {repeat for repeat, _first in repeats[sample["sample_id"]]}
        now = max(t.valid_from for t in turns if t.valid_from is not None) + timedelta(hours=1)
        for qa in sample["qa"]:
            n_cited += bool(evidence_of(qa) & repeated)
            base = await recaller.prepare(owner, qa["question"], as_of=now, token_budget=10**9)
            assert base is not None and base.embedding is not None
            requests = {
                "hybrid": replace(base, min_similarity=None),
                "lexical": replace(base, embedding=None, model_id=None, min_similarity=None),
                "dense": replace(base, query="", min_similarity=None),
            }
            work.append(
                (owner, {m: recall_params(requests[m]) for m in modes}, evidence_of(qa), dia_of)
            )
    embedder.save()
    if marker:
        marker.write_text(json.dumps(known))
    su_db = with_params(su, dbname="harbor")
    with psycopg.connect(su_db, autocommit=True) as conn:
        conn.execute("analyze harbor.memories")
        conn.execute("analyze harbor.memory_embeddings")
    n_repeats = sum(len(r) for r in repeats.values())
    if n_repeats:
        print("\n".join(repeats_summary(repeats, n_turns, n_cited, len(work))))
    print(
        f"data: {len(data)} conversations, {n_turns} turns, {len(work)} questions"
        + (
            f"; repeated turns: {n_repeats}, each stored once and scored against its first copy"
            if n_repeats
            else ""
        ),
        flush=True,
    )

    new_sql = sql_query("recall")
    old_sql = old_query(new_sql, old_functions(args.ref))
    lat: dict[tuple[str, str], list[float]] = defaultdict(list)
    same: dict[str, int] = defaultdict(int)
    quality: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    # past psycopg's prepare threshold on both statements
    for owner, params, _, _ in work[:10]:
        for mode in modes:
            for sql in (new_sql, old_sql):
                await db.fetch_in_one_round_trip(owner, sql, params[mode])
    before = await server_times(db, su_db)
    async with db.autocommit() as aconn:
        cur = await aconn.execute("select pg_catalog.pg_backend_pid() as pid")
        row = await cur.fetchone()
        assert row is not None
        backend = int(row["pid"])
    cpu: dict[tuple[str, str], list[float]] = defaultdict(list)
    i = 0
    for round_no in range(args.rounds):
        for owner, params, evidence, dias_of in work:
            for mode in modes:
                got: dict[str, list[Any]] = {}
                for side in ("old", "new") if i % 2 else ("new", "old"):
                    c0 = _on_cpu(backend)
                    t0 = time.perf_counter()
                    rows = await db.fetch_in_one_round_trip(
                        owner, old_sql if side == "old" else new_sql, params[mode]
                    )
                    lat[(mode, side)].append(time.perf_counter() - t0)
                    cpu[(mode, side)].append(_on_cpu(backend) - c0)
                    got[side] = rows
                i += 1
                if round_no == 0:
                    same[mode] += _answer(got["old"]) == _answer(got["new"])
                    for side, rows in got.items():
                        ranked = [r["id"] for r in rows]
                        for k in KS:
                            found = turns_found(ranked, dias_of, k)
                            quality[(mode, side, k)].append(recall_of(found, evidence))
    after = await server_times(db, su_db)
    await db.close()

    def inside(name: str) -> str:
        calls = after.get(name, (0, 0.0))[0] - before.get(name, (0, 0.0))[0]
        total = after.get(name, (0, 0.0))[1] - before.get(name, (0, 0.0))[1]
        return f"{total / calls:.3f} ms over {calls} calls" if calls else "not reported"

    print(f"inside the server (mean, all modes): old {inside('recall_ab')}, new {inside('recall')}")
    table: list[list[str]] = []
    for mode in modes:
        old, new = lat[(mode, "old")], lat[(mode, "new")]
        diffs = [o - n for o, n in zip(old, new, strict=True)]

        def p(xs: list[float], q: float) -> float:
            s = sorted(xs)
            return 1000 * s[int(q * (len(s) - 1))]

        r = {
            side: "/".join(f"{100 * statistics.mean(quality[(mode, side, k)]):.1f}" for k in KS)
            for side in ("old", "new")
        }
        print(
            f"{mode:8s} client p50/p95: old {p(old, 0.5):.3f}/{p(old, 0.95):.3f} ms,"
            f" new {p(new, 0.5):.3f}/{p(new, 0.95):.3f} ms;"
            f" paired old - new median {1000 * statistics.median(diffs):+.3f} ms;"
            f" server CPU p50 old {p(cpu[(mode, 'old')], 0.5):.3f},"
            f" new {p(cpu[(mode, 'new')], 0.5):.3f} ms"
            f" (mean {1000 * statistics.mean(cpu[(mode, 'old')]):.3f},"
            f" {1000 * statistics.mean(cpu[(mode, 'new')]):.3f});"
            f" identical {same[mode]} of {len(work)};"
            f" R@5/10/25 old {r['old']}, new {r['new']}"
        )
        c_old, c_new = p(cpu[(mode, "old")], 0.5), p(cpu[(mode, "new")], 0.5)
        table.append(
            [
                mode,
                f"{p(old, 0.5):.1f} / {p(new, 0.5):.1f}",
                f"{1000 * statistics.median(diffs):+.1f} ms",
                f"{c_old:.2f} / {c_new:.2f} ({100 * (c_new - c_old) / c_old:+.0f}%)"
                if c_old
                else f"{c_old:.2f} / {c_new:.2f}",
                f"{same[mode]} of {len(work)}",
                r["new"].replace("/", " / ")
                if r["old"] == r["new"]
                else f"{r['old']} -> {r['new']}",
            ]
        )
    return table


def write_results(rows: list[list[str]], ref: str, *, path: Path = RESULTS) -> None:
    """Replace RESULTS.md's ``locomo-ab`` section with the paired table of a run."""
    record(
        "locomo-ab",
        title="Recall speed on LoCoMo text, paired (`locomo_ab`)",
        data="the LoCoMo dev conversations as `locomo` (one owner each, previous turn as"
        " context); shipped defaults, top_k 25, no floor; each question answered by both"
        f" versions in alternating order on one connection; old = {ref}'s recall SQL,"
        " new = this checkout's",
        header=[
            "mode",
            "client p50 old / new (ms)",
            "paired old - new (median)",
            "server CPU p50 old / new (ms)",
            "identical answers",
            "R@5/10/25",
        ],
        rows=rows,
        notes="Server CPU: the backend's on-CPU time per call (`/proc/PID/schedstat`), which"
        " waiting for a core does not inflate.",
        results=path,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("path", help="locomo-dev.json (not shipped with the project)")
    ap.add_argument("--cache", required=True, help="the vector cache (read; copied first)")
    ap.add_argument("--ref", default="HEAD", help="the commit whose recall SQL is 'old'")
    ap.add_argument("--modes", default="hybrid", help=f"comma-separated, of {','.join(MODES)}")
    ap.add_argument("--rounds", type=int, default=1, help="passes over the questions")
    ap.add_argument("--only", default="", help="these conversations only (comma-separated ids)")
    ap.add_argument(
        "--keep",
        default="",
        help="a directory whose server and ingested conversations outlive the run"
        " (reused by the next run with the same directory)",
    )
    ap.add_argument(
        "--model-path", default=os.environ.get("HARBOR_EMBED_MODEL_PATH", DEFAULT_MODEL)
    )
    ap.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    args = ap.parse_args()
    if bad := set(args.modes.split(",")) - set(MODES):
        raise SystemExit(f"unknown modes: {', '.join(sorted(bad))}")
    sql = old_functions(args.ref)
    print(f"machine: {machine()}")
    print(f"old: {args.ref}'s recall SQL; new: this checkout's", flush=True)
    keep = Path(args.keep) if args.keep else None
    started = kept_server(keep) if keep else private_server()
    with tempfile.TemporaryDirectory() as tmp, started as (su, _base):
        cache = Path(tmp)
        for f in Path(args.cache).glob("vectors-*.npz"):
            shutil.copy(f, cache / f.name)
        server.bootstrap(su)
        owner_url = with_params(su, dbname="harbor", user="harbor_owner")
        migrate.upgrade(owner_url)
        install(owner_url, su, sql)
        try:
            rows = asyncio.run(run(args, su, cache, keep))
        finally:
            with psycopg.connect(owner_url, autocommit=True) as conn:
                drop_ab(conn)
    if args.record:
        write_results(rows, args.ref)


if __name__ == "__main__":
    main()
