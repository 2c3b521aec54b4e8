"""Retrieval quality on LoCoMo: recall@5/10/25 for dense, lexical and hybrid recall.

    python benchmarks/locomo.py PATH/locomo-dev.json [--model-path DIR] [--no-context] [--record]

``--record`` writes R@5/10/25 and the recall p50 of each mode into
benchmarks/RESULTS.md's ``locomo`` section.

Protocol (LoCoMo, task_eval/): one conversation at a time, one owner per
conversation; every turn becomes a memory whose text is ``Speaker said,
"text"`` (plus `` and shared <caption>``); the query is the raw question; a
question's recall@k is the share of its evidence ids among the top k turns
(empty evidence counts 1); all five categories and the overall mean.

Repeated turns: the store keeps one memory per distinct content, so a turn
that repeats an earlier turn of its conversation word for word is stored once,
as the first copy (valid from the first copy's session, with its context).
The benchmark counts these repeats, prints them per conversation and in total
(with how many questions cite one), and scores a question whose evidence is a
repeat against the stored first copy: the repeat's id counts as found when that
memory is among the top k. That is what a user of the product gets back: the
same words, once, dated when they were first said. The repeat is neither
dropped (it would hide the case) nor counted as missed (the text was recalled).
k counts recalled memories, so a memory standing for two turns takes one place.

Everything goes through the public API: ``MemoryManager.save_many`` (batched
embedding with the local MiniLM model) and ``harbor.recall()`` (one SQL call
per question; the three modes differ only in what is passed: the query text
and/or the query embedding). No language model runs at query time.

Policy for this benchmark, said plainly:
  * each memory carries the preceding turn as its ``context`` (turns lean on
    their neighbours: docs/decisions.md, "A memory carries its conversation
    context"); ``--no-context`` switches it off;
  * as a user would run the product: each turn is valid from its session's
    date (LoCoMo's ``session_N_date_time``), and "now" is an hour after the
    conversation's last session, with the shipped recency half-life; the
    ``recency off`` lines show the same recall without it (``--undated``
    saves every turn at ingest time instead); every memory has the same
    importance (0.5);
  * the shipped ranking defaults (MemoryPolicy, harbor.recall()); the ``old
    defaults`` line is the defaults before the cross-validated ones (rrf_k 60,
    weights 1:1, a one-week half-life);
  * no relevance threshold on the dense leg for the main table (a question
    is never left without candidates); one extra row shows the hybrid with
    the embedder's calibrated threshold;
  * top_k = 25, no token budget.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, harbor_database, machine, private_server, record, with_params
from _embed_cache import CachedEmbedder

from harbor_pg.context.recall import MemoryRecall, RecallRequest
from harbor_pg.db import migrate, server
from harbor_pg.db.connection import Database
from harbor_pg.embedders.fastembed import FastEmbedEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.policy import MemoryPolicy
from harbor_pg.records import Memory
from harbor_pg.tiers.rows import recall_in_one_round_trip

KS = (5, 10, 25)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
EVIDENCE = re.compile(r"D(\d+):(\d+)")
DEFAULT_MODEL = "/work/shared/models/all-MiniLM-L6-v2-int8"


@dataclass(frozen=True)
class Turn:
    """One conversation turn: its id, rendered text, session and the session's date."""

    dia_id: str
    text: str
    session: int
    valid_from: datetime | None


def session_date(raw: str | None) -> datetime | None:
    """A LoCoMo session date ("1:56 pm on 8 May, 2023") as a UTC time, None if absent."""
    if not raw:
        return None
    return datetime.strptime(raw.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


def turns_of(sample: dict[str, Any]) -> list[Turn]:
    """Every turn of a conversation, in order, with its session's date."""
    conv = sample["conversation"]
    sessions = sorted(
        (int(k.split("_")[1]), v)
        for k, v in conv.items()
        if re.fullmatch(r"session_\d+", k) and isinstance(v, list)
    )
    out = []
    for n, turns in sessions:
        when = session_date(conv.get(f"session_{n}_date_time"))
        for t in turns:
            text = f'{t["speaker"]} said, "{t["text"]}"'
            if t.get("blip_caption"):
                text += f" and shared {t['blip_caption']}"
            out.append(Turn(t["dia_id"], text, n, when))
    return out


def turn_memories(sample: dict[str, Any], turns: list[Turn], *, context: bool) -> list[Memory]:
    """The memories of a conversation's turns: valid from their session's date, each
    with the preceding turn as its context (unless ``context`` is false)."""
    memories = []
    previous: str | None = None
    for turn in turns:
        memories.append(
            Memory(
                # a deterministic id per turn, in no meaningful order: ties in a
                # ranking break by id, so random ids moved R@k by 0.1-0.2 points
                # from one run to the next
                id=hashlib.sha256(f"{sample['sample_id']}:{turn.dia_id}".encode()).hexdigest()[:32],
                content=turn.text,
                context=previous if context else None,
                metadata={"dia_id": turn.dia_id},
                valid_from=turn.valid_from,
            )
        )
        previous = turn.text
    return memories


def evidence_of(qa: dict[str, Any]) -> set[str]:
    ids: set[str] = set()
    for raw in qa.get("evidence") or []:
        for s, t in EVIDENCE.findall(str(raw)):
            ids.add(f"D{int(s)}:{int(t)}")
    return ids


def recall_of(found: set[str], evidence: set[str]) -> float:
    """The share of ``evidence`` among the turn ids ``found`` (1 if there is no evidence)."""
    if not evidence:
        return 1.0
    return len(evidence & found) / len(evidence)


def turns_found(ranked: list[str], dia_of: dict[str, list[str]], k: int) -> set[str]:
    """The turn ids the first ``k`` recalled memories stand for: one memory stands for
    every copy of a turn repeated word for word, and k counts memories, not turns."""
    return {d for memory_id in ranked[:k] for d in dia_of.get(memory_id, [])}


def repeats_of(order: list[str], dia_of: dict[str, list[str]]) -> list[tuple[str, str]]:
    """The repeated turns of a conversation as stored, in the turns' ``order``:
    ``(repeat, first copy)`` for every turn id a memory stands for after its first
    (``dia_of`` lists each memory's turn ids in conversation order)."""
    first = {d: ids[0] for ids in dia_of.values() for d in ids[1:]}
    return [(d, first[d]) for d in order if d in first]


def repeats_summary(
    repeats: dict[str, list[tuple[str, str]]], n_turns: int, n_cited: int, n_questions: int
) -> list[str]:
    """The lines reporting the repeated turns of a run: per conversation (``repeats``:
    sample id -> its ``(repeat, first copy)`` pairs) and in total, with ``n_cited`` of
    the ``n_questions`` questions citing a repeat."""
    n_repeats = sum(len(r) for r in repeats.values())
    return [
        "repeated turns (word for word the same as an earlier turn of the conversation,"
        " so stored once, as the first copy; a question whose evidence is a repeat is"
        " scored against that first copy):",
        "  " + ", ".join(f"{name}: {len(r)}" for name, r in repeats.items()),
        f"  total: {n_repeats} of {n_turns} turns;"
        f" {n_cited} of {n_questions} questions have a repeat among their evidence",
    ]


async def run(args: argparse.Namespace, su: str) -> dict[str, Any]:
    data = json.loads(Path(args.path).read_text())
    embedder: Any = FastEmbedEmbedder(model_path=args.model_path, model_id="minilm-l6-int8")
    if args.cache:
        embedder = CachedEmbedder(embedder, args.cache)
    db = harbor_database(su)
    await db.open()
    manager = MemoryManager.from_database(db, embedder=embedder)
    # the shipped policy, with top_k 25 and no relevance floor (see the docstring)
    policy = MemoryPolicy(recall_top_k=25, relevance_threshold=0.0)
    recaller = MemoryRecall(policy=policy, memories=manager.long_term, embedder=embedder)
    weights = [float(w) for w in args.lexical_weights.split(",") if w]
    modes = [
        "dense",
        "lexical",
        "hybrid",
        "dense, recency off",
        "lexical, recency off",
        "hybrid, recency off",
        "hybrid, fusion weighted",
        "hybrid, old defaults",
        "hybrid+threshold",
    ] + [f"hybrid, lexical weight {w:g}" for w in weights]
    points = {f"hybrid, {spec}": parse_point(spec) for spec in args.point}
    modes += list(points)
    scores: dict[str, dict[int, dict[int, list[float]]]] = {
        m: {k: defaultdict(list) for k in KS} for m in modes
    }
    per_conv: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    latencies: dict[str, list[float]] = defaultdict(list)
    t_ingest = 0.0
    n_turns = n_questions = n_dated = n_on_repeats = 0
    repeats: dict[str, list[tuple[str, str]]] = {}
    for sample in data:
        owner = MemoryOwner(tenant_id="locomo", principal_id=sample["sample_id"])
        t0 = time.perf_counter()
        stored = await store_conversation(
            manager, db, owner, sample, context=args.context, dated=args.dated
        )
        t_ingest += time.perf_counter() - t0
        if isinstance(embedder, CachedEmbedder):
            embedder.save()
        turns, dia_of = stored.turns, stored.dia_of
        n_turns += len(turns)
        n_dated += stored.dated
        repeats[sample["sample_id"]] = stored.repeats
        # "now" just after the conversation's last session (ingest time when undated)
        dates = [t.valid_from for t in turns if t.valid_from is not None]
        now = max(dates) + timedelta(hours=1) if args.dated and dates else None
        print(
            f"{sample['sample_id']}: {len(turns)} turns ingested"
            f" in {time.perf_counter() - t0:.1f}s,"
            f" {len(sample['qa'])} questions; {stored.describe(sample['qa'])}",
            flush=True,
        )
        for qa in sample["qa"]:
            n_questions += 1
            evidence = evidence_of(qa)
            n_on_repeats += bool(evidence & stored.repeated)
            category = int(qa["category"])
            base = await recaller.prepare(owner, qa["question"], as_of=now, token_budget=10**9)
            assert base is not None and base.embedding is not None
            requests = {
                "dense": replace(base, query="", min_similarity=None),
                "lexical": replace(base, embedding=None, model_id=None, min_similarity=None),
                "hybrid": replace(base, min_similarity=None),
                "dense, recency off": replace(
                    base, query="", min_similarity=None, recency_half_life_hours=None
                ),
                "lexical, recency off": replace(
                    base,
                    embedding=None,
                    model_id=None,
                    min_similarity=None,
                    recency_half_life_hours=None,
                ),
                "hybrid, recency off": replace(
                    base, min_similarity=None, recency_half_life_hours=None
                ),
                # the defaults before cross-validation: rrf_k 60, weights 1:1, a one-week half-life
                "hybrid, old defaults": replace(
                    base,
                    min_similarity=None,
                    rrf_k=60,
                    dense_weight=1.0,
                    recency_half_life_hours=168.0,
                ),
                "hybrid, fusion weighted": replace(base, min_similarity=None, fusion="weighted"),
                "hybrid+threshold": replace(base, min_similarity=embedder.relevance_threshold),
            }
            for w in weights:
                requests[f"hybrid, lexical weight {w:g}"] = replace(
                    base, min_similarity=None, lexical_weight=w
                )
            for mode, changes in points.items():
                requests[mode] = replace(base, min_similarity=None, **changes)
            for mode, request in requests.items():
                t = time.perf_counter()
                ranked = await _recall(db, owner, request)
                latencies[mode].append(time.perf_counter() - t)
                for k in KS:
                    found = recall_of(turns_found(ranked, dia_of, k), evidence)
                    scores[mode][k][category].append(found)
                    per_conv[mode][f"{sample['sample_id']}@{k}"].append(found)
    if isinstance(embedder, CachedEmbedder):
        embedder.save()
    await db.close()

    n_repeats = sum(len(r) for r in repeats.values())
    print()
    print("\n".join(repeats_summary(repeats, n_turns, n_on_repeats, n_questions)))
    print(f"\nmachine: {machine()}")
    described = (
        f"{len(data)} conversations, {n_turns} turns, {n_questions} questions;"
        f" context={'previous turn' if args.context else 'none'};"
        f" times={'session dates, now = last session + 1 h' if args.dated else 'ingest time'}"
        + (
            f" (stored valid-from = session date: {n_dated} of {n_turns - n_repeats} stored turns)"
            if args.dated
            else ""
        )
        + (
            f"; repeated turns: {n_repeats}, each stored once and scored against its first copy"
            if n_repeats
            else ""
        )
        + ";"
        f" recency half-life {policy.recency_half_life_hours:g} h;"
        f" embedder {embedder.model_id} (threshold {embedder.relevance_threshold});"
        f" ingest {t_ingest:.1f}s"
    )
    print(f"data: {described}")
    print(
        "\n| mode | k | " + " | ".join(CATEGORIES[c] for c in sorted(CATEGORIES)) + " | overall |"
    )
    print("|---|---|" + "---|" * (len(CATEGORIES) + 1))
    for mode in modes:
        for k in KS:
            per = scores[mode][k]
            cells = [
                f"{100 * statistics.mean(per[c]):.1f}" if per[c] else "-"
                for c in sorted(CATEGORIES)
            ]
            overall = 100 * statistics.mean([x for c in per for x in per[c]])
            print(f"| {mode} | {k} | " + " | ".join(cells) + f" | **{overall:.1f}** |")
    for k in KS:
        print(f"\nper conversation, R@{k}:")
        for mode in modes:
            cells = [
                f"{name}: {100 * statistics.mean(per_conv[mode][f'{name}@{k}']):.1f}"
                for name in (s["sample_id"] for s in data)
            ]
            print(f"  {mode:24s} " + ", ".join(cells))
    print()
    for mode in modes:
        ms = sorted(1000 * x for x in latencies[mode])
        print(
            f"{mode:24s} harbor.recall p50 {statistics.median(ms):.2f} ms,"
            f" p95 {ms[int(0.95 * (len(ms) - 1))]:.2f} ms"
        )
    return {
        "data": described,
        "modes": {
            mode: {
                **{
                    k: 100 * statistics.mean([x for c in scores[mode][k].values() for x in c])
                    for k in KS
                },
                "p50_ms": 1000 * statistics.median(latencies[mode]),
            }
            for mode in modes
        },
    }


def write_results(summary: dict[str, Any], *, path: Path = RESULTS) -> None:
    """Replace RESULTS.md's ``locomo`` section with a run's R@k and recall p50 per mode."""
    record(
        "locomo",
        title="Recall quality on LoCoMo (`locomo`)",
        data=summary["data"] + "; top_k 25, no token budget, no language model",
        header=["mode", *(f"R@{k}" for k in KS), "harbor.recall p50 ms"],
        rows=[
            [mode, *(f"{figures[k]:.1f}" for k in KS), f"{figures['p50_ms']:.1f}"]
            for mode, figures in summary["modes"].items()
        ],
        notes="R@k: the share of a question's evidence turns among the top k, mean over"
        " all questions (all five categories).",
        results=path,
    )


def parse_point(spec: str) -> dict[str, Any]:
    """``rrf_k=3,dense_weight=1,recency_half_life_hours=off``: RecallRequest fields to change
    (recall's existing arguments, passed as a user of the product would)."""
    out: dict[str, Any] = {}
    for item in spec.split(","):
        name, _, value = item.partition("=")
        name = name.strip()
        if name == "fusion":
            out[name] = value
        elif name == "rrf_k":
            out[name] = int(value)
        elif name == "recency_half_life_hours" and value == "off":
            out[name] = None
        elif name in {"dense_weight", "lexical_weight", "neighbour_weight", "date_weight"} or (
            name == "recency_half_life_hours"
        ):
            out[name] = float(value)
        else:
            raise SystemExit(f"--point: unknown or unsupported field {name!r}")
    return out


@dataclass(frozen=True)
class Stored:
    """A conversation as stored: its turns, the turn ids each memory stands for, the
    repeated turns (``(repeat, first copy)`` dia ids) and how many memories were read
    back valid from their session's date (0 when undated)."""

    turns: list[Turn]
    dia_of: dict[str, list[str]]
    repeats: list[tuple[str, str]]
    dated: int

    @property
    def repeated(self) -> set[str]:
        """The dia ids of the turns stored only as an earlier copy."""
        return {repeat for repeat, _first in self.repeats}

    def describe(self, questions: list[dict[str, Any]]) -> str:
        """One line on the repeated turns and the ``questions`` that cite one."""
        if not self.repeats:
            return "0 repeated turns"
        cited = sum(1 for qa in questions if evidence_of(qa) & self.repeated)
        pairs = ", ".join(f"{repeat} = {first}" for repeat, first in self.repeats[:3])
        more = ", ..." if len(self.repeats) > 3 else ""
        return (
            f"{len(self.repeats)} repeated turn{'s' if len(self.repeats) != 1 else ''}"
            f" ({pairs}{more}) stored once, as the first copy with its date;"
            f" {cited} question{'s' if cited != 1 else ''} citing a repeat scored against"
            " the first copy"
        )


async def store_conversation(
    manager: MemoryManager,
    db: Database,
    owner: MemoryOwner,
    sample: dict[str, Any],
    *,
    context: bool,
    dated: bool,
) -> Stored:
    """Save every turn of ``sample`` for ``owner`` through ``save_many`` and map the
    memories back to the turns.

    The store keeps one memory per distinct content (its dedup), so a turn that
    repeats an earlier one word for word comes back as the earlier turn's memory:
    valid from the earlier session's date, with the earlier turn's context. It is
    counted as a repeat and that memory stands for both turns; only the first copies
    are checked against their session's date.
    """
    turns = turns_of(sample)
    memories = turn_memories(sample, turns, context=context)
    if not dated:
        memories = [m.model_copy(update={"valid_from": None}) for m in memories]
    results = await manager.save_many(owner, memories, batch_size=64)
    dia_of: dict[str, list[str]] = defaultdict(list)
    first: dict[str, Turn] = {}
    for turn, res in zip(turns, results, strict=True):
        assert res.memory.id is not None
        first.setdefault(res.memory.id, turn)
        dia_of[res.memory.id].append(turn.dia_id)
    n_dated = await check_dates(db, owner, first) if dated else 0
    repeats = repeats_of([t.dia_id for t in turns], dia_of)
    return Stored(turns, dict(dia_of), repeats, n_dated)


async def check_dates(db: Database, owner: MemoryOwner, first: dict[str, Turn]) -> int:
    """How many memories are stored valid from their session's date (``first``: each
    memory id and the first turn stored as it), read back from harbor.memories as the
    owner sees them; stops the run on the first that is not."""
    expected = {memory_id: turn.valid_from for memory_id, turn in first.items()}
    async with db.transaction(owner) as conn:
        cur = await conn.execute(
            "select id, lower(valid) as valid_from from harbor.memories where id = any(%s)",
            (list(expected),),
        )
        stored = {r["id"]: r["valid_from"] for r in await cur.fetchall()}
    wrong = [(i, expected[i], stored.get(i)) for i in expected if stored.get(i) != expected[i]]
    if wrong:
        raise SystemExit(f"{len(wrong)} turns not stored at their session's date, e.g. {wrong[0]}")
    return sum(1 for turn in first.values() if turn.valid_from is not None)


async def _recall(db: Database, owner: MemoryOwner, request: RecallRequest) -> list[str]:
    items = await recall_in_one_round_trip(db, owner, request)
    return [item.memory.id for item in items if item.memory.id is not None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("path", help="locomo-dev.json (not shipped with the project)")
    ap.add_argument(
        "--model-path",
        default=os.environ.get("HARBOR_EMBED_MODEL_PATH", DEFAULT_MODEL),
        help="local MiniLM model directory (default: %(default)s)",
    )
    ap.add_argument(
        "--no-context",
        dest="context",
        action="store_false",
        help="index each turn alone, without the preceding turn",
    )
    ap.add_argument(
        "--undated",
        dest="dated",
        action="store_false",
        help="save every turn at ingest time instead of its session's date",
    )
    ap.add_argument(
        "--cache",
        default=os.environ.get("HARBOR_BENCH_CACHE", ""),
        help="directory for a cache of the vectors (outside the repository; default: none)",
    )
    ap.add_argument(
        "--lexical-weights",
        default="",
        help="extra hybrid rows with these lexical leg weights (dense weight 1), e.g. 1.5,2",
    )
    ap.add_argument(
        "--point",
        action="append",
        default=[],
        help="an extra hybrid row with these recall arguments, e.g."
        " rrf_k=3,dense_weight=1,neighbour_weight=1,date_weight=3 (repeatable)",
    )
    ap.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    args = ap.parse_args()
    with private_server() as (su, _base):
        server.bootstrap(su)
        migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
        summary = asyncio.run(run(args, su))
    if args.record:
        write_results(summary)


if __name__ == "__main__":
    main()
