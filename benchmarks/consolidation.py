"""Consolidation on conversation text: store size, recall quality and time, before and after.

    python -m benchmarks consolidation PATH/locomo-dev.json [--cache DIR] [--restate 0.5]
                                       [--seed 7] [--record]

A store that keeps every restatement of a fact grows without learning anything. This
ingests the LoCoMo dev conversations as ``benchmarks/locomo.py`` does (one owner a
conversation, each turn a memory valid from its session's date, the previous turn as
its context, MiniLM vectors, from the cache in ``DIR`` when given), then restates
facts over the following months: a share ``--restate`` of the turns (seeded) gets one
to three restatements, each valid from one to 120 days after the turn and changed a
little, one of:

- the same words with other case and punctuation ("... SAID, ..." / a trailing "!"),
- a filler before it ("As I said before, ..."), or
- a filler after it ("..., just so you know").

Then, for every conversation at once, at a "now" after the last restatement:

- the store's current memories, before and after ``MemoryManager.consolidate`` (the
  shipped threshold: MiniLM's calibrated ``duplicate_threshold`` on its content vectors, and
  the text rule);
- R@5/10/25 of the dev questions, hybrid recall with the shipped defaults, top_k 25,
  no relevance floor, before and after (a restatement counts as its turn; a successor
  as every turn it merged);
- consolidation's wall time, per 10,000 memories read.

The restated copies hold no new fact: an R@k that falls after consolidation means a
turn's only copy that ranked was merged into a text ranking worse.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import harbor_database, machine, private_server, record, with_params
from _embed_cache import CachedEmbedder
from locomo import (
    DEFAULT_MODEL,
    KS,
    evidence_of,
    recall_of,
    turn_memories,
    turns_found,
    turns_of,
)

from harbor_pg.db import migrate, server
from harbor_pg.embedders.fastembed import FastEmbedEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import Memory

QUESTION = "How much does consolidation shrink a store of restated facts, and what does it cost?"

_BEFORE = ("As I said before, ", "Like I mentioned, ", "To repeat, ")
_AFTER = (", just so you know", ", as I told you", ", once more")


def restated(text: str, rng: random.Random) -> str:
    """``text`` changed a little, one of three ways (see the module docstring)."""
    kind = rng.randrange(3)
    if kind == 0:
        return (text.upper() if rng.random() < 0.5 else text.lower()).rstrip(".") + "!"
    if kind == 1:
        return rng.choice(_BEFORE) + text
    return text.rstrip(".") + rng.choice(_AFTER)


async def run(args: argparse.Namespace, su: str) -> dict[str, Any]:
    data = json.loads(Path(args.path).read_text())
    rng = random.Random(args.seed)
    embedder: Any = FastEmbedEmbedder(model_path=args.model_path, model_id="minilm-l6-int8")
    if args.cache:
        embedder = CachedEmbedder(embedder, args.cache)
    db = harbor_database(su)
    await db.open()
    manager = MemoryManager.from_database(
        db, embedder=embedder, policy=MemoryPolicy(recall_top_k=25, relevance_threshold=0.0)
    )
    owners: list[tuple[MemoryOwner, dict[str, Any]]] = []
    dia_of: dict[str, list[str]] = defaultdict(list)
    n_turns = n_restated = 0
    for sample in data:
        owner = MemoryOwner(tenant_id="locomo", principal_id=sample["sample_id"])
        turns = turns_of(sample)
        memories = turn_memories(sample, turns, context=True)
        extra: list[Memory] = []
        for turn, memory in zip(turns, memories, strict=True):
            if rng.random() >= args.restate or memory.valid_from is None:
                continue
            for k in range(rng.randint(1, 3)):
                extra.append(
                    memory.model_copy(
                        update={
                            "id": f"{memory.id}-r{k}",
                            "content": restated(turn.text, rng),
                            "valid_from": memory.valid_from + timedelta(days=rng.uniform(1, 120)),
                        }
                    )
                )
        saved = await manager.save_many(owner, [*memories, *extra], batch_size=64)
        for memory, result in zip([*memories, *extra], saved, strict=True):
            if result.created and result.memory.id is not None:
                dia_of[result.memory.id].append(str(memory.metadata["dia_id"]))
        n_turns += len(memories)
        n_restated += sum(r.created for r in saved[len(memories) :])
        owners.append((owner, sample))
        print(
            f"{sample['sample_id']}: {len(memories)} turns, {len(extra)} restatements", flush=True
        )
    if isinstance(embedder, CachedEmbedder):
        embedder.save()
    now = datetime.now(UTC) + timedelta(minutes=1)

    async def size() -> int:
        total = 0
        for owner, _sample in owners:
            total += len(await manager.current_memories(owner, ["user"], limit=100_000))
        return total

    async def quality(at: datetime) -> dict[int, float]:
        scores: dict[int, list[float]] = {k: [] for k in KS}
        for owner, sample in owners:
            for qa in sample["qa"]:
                got = await manager.recall(owner, qa["question"], as_of=at, token_budget=10**9)
                ranked = [m.id or "" for m in got]
                for k in KS:
                    scores[k].append(recall_of(turns_found(ranked, dia_of, k), evidence_of(qa)))
        return {k: 100 * statistics.mean(v) for k, v in scores.items()}

    size_before = await size()
    before = await quality(now)
    t0 = time.perf_counter()
    merges = superseded = 0
    for owner, _sample in owners:
        report = await manager.consolidate(owner, max_merges=100_000)
        merges += len(report.merges)
        superseded += report.superseded
        for merge in report.merges:
            dia_of[merge.successor_id] = sorted({d for i in merge.merged_ids for d in dia_of[i]})
    seconds = time.perf_counter() - t0
    now = datetime.now(UTC) + timedelta(minutes=1)
    size_after = await size()
    after = await quality(now)
    await db.close()
    summary = {
        "conversations": len(owners),
        "turns": n_turns,
        "restatements": n_restated,
        "size_before": size_before,
        "size_after": size_after,
        "merges": merges,
        "superseded": superseded,
        "seconds": seconds,
        "per_10k": seconds * 10_000 / size_before,
        "before": before,
        "after": after,
        "questions": sum(len(s["qa"]) for _o, s in owners),
    }
    r = lambda q: " / ".join(f"{q[k]:.1f}" for k in KS)  # noqa: E731
    print(f"machine: {machine()}")
    print(
        f"{n_turns} turns + {n_restated} restatements; current memories {size_before}"
        f" -> {size_after} ({merges} merges of {superseded} memories)"
    )
    print(f"R@5/10/25 before {r(before)}, after {r(after)} ({summary['questions']} questions)")
    print(f"consolidation {seconds:.1f} s, {summary['per_10k']:.1f} s per 10,000 memories")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("path", help="locomo-dev.json (not shipped with the project)")
    ap.add_argument("--cache", default=os.environ.get("HARBOR_BENCH_CACHE", ""))
    ap.add_argument("--restate", type=float, default=0.5, help="share of turns restated")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--model-path", default=os.environ.get("HARBOR_EMBED_MODEL_PATH", DEFAULT_MODEL)
    )
    ap.add_argument("--record", action="store_true", help="write the figures into RESULTS.md")
    args = ap.parse_args()
    with private_server() as (su, _base):
        server.bootstrap(su)
        migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
        summary = asyncio.run(run(args, su))
    if args.record:
        s = summary
        record(
            "consolidation",
            title="Consolidation of restated facts (`consolidation`)",
            data=f"the LoCoMo dev conversations ({s['turns']} turns, one owner each, previous"
            f" turn as context), plus {s['restatements']} restatements of half the turns"
            " (case and punctuation, or a filler phrase) one to 120 days later; MiniLM;"
            f" shipped defaults; {s['questions']} questions, top_k 25, no floor",
            header=["", "current memories", "R@5 / R@10 / R@25"],
            rows=[
                ["before", s["size_before"], " / ".join(f"{s['before'][k]:.1f}" for k in KS)],
                ["after", s["size_after"], " / ".join(f"{s['after'][k]:.1f}" for k in KS)],
            ],
            notes=f"{s['merges']} merges of {s['superseded']} memories in {s['seconds']:.1f} s:"
            f" {s['per_10k']:.1f} s per 10,000 memories (all five owners, one call each).",
        )


if __name__ == "__main__":
    main()
