"""Leave-one-conversation-out cross-validation of recall's ranking parameters on LoCoMo.

    python benchmarks/locomo_cv.py dump PATH/locomo-dev.json --cache DIR
    python benchmarks/locomo_cv.py sweep --cache DIR [--record]

``dump`` ingests the conversations exactly as ``benchmarks/locomo.py`` does
(each turn with its session's date, the preceding turn as its context,
through ``MemoryManager.save_many``) into a private embedded server, and
writes to ``DIR`` what the ranking reads: every turn's two vectors (content,
context + content), each question's vector, and each question's lexical
list from ``harbor.recall()`` itself (BM25 ranks and scores, 200 deep).
Vectors are cached in ``DIR`` (``benchmarks/_embed_cache.py``), so a second
dump embeds nothing. Keep ``DIR`` outside the repository.

``sweep`` replays ``harbor.recall()``'s fusion and scoring in numpy on those
lists (the dense leg's cosine ranking, the lexical ranks, fusion, recency
factor, the legs cut to ``candidates`` = 50 as at top_k 25) for a grid of
parameters and, for each held-out conversation, picks the grid point with
the best mean R@10 (then R@5) on the other four and scores it on the fifth.
It prints the cross-validated R@5/10/25 (mean over conversations, and the
spread as min-max and standard deviation), the figure of the shipped
defaults, and which point each fold chose. A parameter is worth shipping
when the cross-validated figure rises, not only the plain dev figure.
``sweep --record`` writes those figures into benchmarks/RESULTS.md's
``locomo-cv`` section.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import pickle
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, harbor_database, private_server, record, with_params
from _embed_cache import CachedEmbedder
from locomo import DEFAULT_MODEL, KS, evidence_of, turn_memories, turns_of
from locomo_signals import leg_ranks

from harbor_pg.context.recall import RecallRequest
from harbor_pg.db import migrate, server
from harbor_pg.embedders.fastembed import FastEmbedEmbedder
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner, MemoryScope
from harbor_pg.tiers.rows import recall_in_one_round_trip

DEPTH = 200


# ---------------------------------------------------------------- dump


async def dump(args: argparse.Namespace, su: str) -> None:
    data = json.loads(Path(args.path).read_text())
    embedder = CachedEmbedder(
        FastEmbedEmbedder(model_path=args.model_path, model_id="minilm-l6-int8"), args.cache
    )
    db = harbor_database(su)
    await db.open()
    manager = MemoryManager.from_database(db, embedder=embedder)
    out: list[dict[str, Any]] = []
    try:
        for sample in data:
            owner = MemoryOwner(tenant_id="locomo", principal_id=sample["sample_id"])
            turns = turns_of(sample)
            memories = turn_memories(sample, turns, context=True)
            await manager.save_many(owner, memories, batch_size=64)
            embedder.save()
            content = np.stack([embedder.vector(m.content) for m in memories])  # type: ignore[misc]
            ctx = np.stack(
                [
                    embedder.vector(f"{m.context.strip()}\n{m.content}")  # type: ignore[misc]
                    if m.context
                    else np.zeros(content.shape[1], dtype=np.float32)
                    for m in memories
                ]
            )
            now = max(t.valid_from for t in turns) + timedelta(hours=1)  # type: ignore[type-var,operator]
            questions = []
            for qa in sample["qa"]:
                qvec = np.asarray(await embedder.embed_query(qa["question"]), dtype=np.float32)
                request = RecallRequest(
                    query=qa["question"],
                    scopes=(MemoryScope.USER,),
                    top_k=DEPTH,
                    candidates=DEPTH,
                    recency_half_life_hours=None,
                    as_of=now,
                )
                rows = await recall_in_one_round_trip(db, owner, request)
                lex = [
                    (r.memory.id, r.lexical_rank, r.lexical_score)
                    for r in rows
                    if r.lexical_rank is not None
                ]
                questions.append(
                    {
                        "question": qa["question"],
                        "category": int(qa["category"]),
                        "evidence": sorted(evidence_of(qa)),
                        "vector": qvec,
                        "lexical": lex,
                    }
                )
            embedder.save()
            out.append(
                {
                    "sample_id": sample["sample_id"],
                    "ids": [m.id for m in memories],
                    "dia": [t.dia_id for t in turns],
                    "session": [t.session for t in turns],
                    "valid_from": np.array([t.valid_from.timestamp() for t in turns]),  # type: ignore[union-attr]
                    "now": now.timestamp(),
                    "content": content,
                    "context": ctx,
                    "has_context": np.array([m.context is not None for m in memories]),
                    "questions": questions,
                }
            )
            print(
                f"{sample['sample_id']}: {len(turns)} turns, {len(questions)} questions", flush=True
            )
    finally:
        await db.close()
    path = Path(args.cache) / "locomo-dump.pkl"
    with path.open("wb") as f:
        pickle.dump(out, f)
    print(f"wrote {path}")


# ---------------------------------------------------------------- sweep


@dataclass(frozen=True)
class Point:
    """One set of ranking parameters, as harbor.recall() takes them."""

    fusion: str = "rrf"  # rrf | weighted
    rrf_k: int = 60
    dense_weight: float = 1.0
    lexical_weight: float = 1.0
    dense_vector: str = "nearer"  # nearer | mean (of a turn's two vectors)
    half_life_hours: float | None = 168.0

    def label(self) -> str:
        hl = "off" if self.half_life_hours is None else f"{self.half_life_hours:g}h"
        fuse = f"rrf k={self.rrf_k}" if self.fusion == "rrf" else "weighted"
        return (
            f"{fuse} wd={self.dense_weight:g} wl={self.lexical_weight:g}"
            f" vec={self.dense_vector} recency={hl}"
        )


@dataclass
class Prepared:
    """One question's legs, as the ranking sees them."""

    evidence: set[str]
    category: int
    dense: dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]]
    lex_idx: np.ndarray[Any, Any]
    lex_rank: np.ndarray[Any, Any]
    lex_score: np.ndarray[Any, Any]


def prepare(conv: dict[str, Any], n: int) -> list[Prepared]:
    ids = conv["ids"]
    pos = {m: i for i, m in enumerate(ids)}
    content, ctx, has = conv["content"], conv["context"], conv["has_context"]
    out = []
    for q in conv["questions"]:
        s_c = content @ q["vector"]
        s_x = ctx @ q["vector"]
        legs = {}
        for name, sim in (
            ("nearer", np.where(has, np.maximum(s_c, s_x), s_c)),
            ("mean", np.where(has, (s_c + s_x) / 2, s_c)),
        ):
            # ties by id, as the SQL does
            order = np.lexsort((np.array(ids), -sim))[:n]
            legs[name] = (order, leg_ranks(sim[order]), sim[order])  # sim[order] is sorted
        lex = [(pos[m], r, s) for m, r, s in q["lexical"] if m in pos][:n]
        out.append(
            Prepared(
                evidence=set(q["evidence"]),
                category=q["category"],
                dense=legs,
                lex_idx=np.array([x[0] for x in lex], dtype=np.int64),
                lex_rank=np.array([x[1] for x in lex], dtype=np.float64),
                lex_score=np.array([x[2] for x in lex], dtype=np.float64),
            )
        )
    return out


def _minmax(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    if len(x) == 0:
        return x
    lo, hi = x.min(), x.max()
    return np.ones_like(x) if hi <= lo else (x - lo) / (hi - lo)


def rank_question(
    p: Point, q: Prepared, age_hours: np.ndarray[Any, Any], ids: np.ndarray[Any, Any], top_k: int
) -> np.ndarray[Any, Any]:
    """The turn indices harbor.recall() would return, best first."""
    d_idx, d_rank, d_sim = q.dense[p.dense_vector]
    rel: dict[int, float] = {}
    if p.fusion == "rrf":
        d_val = p.dense_weight / (p.rrf_k + d_rank)
        l_val = p.lexical_weight / (p.rrf_k + q.lex_rank)
    else:
        d_val = p.dense_weight * _minmax(d_sim)
        l_val = p.lexical_weight * _minmax(q.lex_score)
    for i, v in zip(d_idx.tolist(), d_val.tolist(), strict=True):
        rel[i] = rel.get(i, 0.0) + v
    for i, v in zip(q.lex_idx.tolist(), l_val.tolist(), strict=True):
        rel[i] = rel.get(i, 0.0) + v
    cand = np.fromiter(rel, dtype=np.int64)
    score = np.fromiter(rel.values(), dtype=np.float64)
    if p.half_life_hours is not None:
        score = score * (1 + 0.5 ** (age_hours[cand] / p.half_life_hours))
    order = np.lexsort((ids[cand], -score))[:top_k]
    return cand[order]  # type: ignore[no-any-return]


def score_conv(
    p: Point, conv: dict[str, Any], prepared: list[Prepared], top_k: int = 25
) -> dict[int, list[float]]:
    age = np.maximum(conv["now"] - conv["valid_from"], 0) / 3600.0
    ids = np.array(conv["ids"])
    dia = conv["dia"]
    out: dict[int, list[float]] = {k: [] for k in KS}
    for q in prepared:
        ranked = [dia[i] for i in rank_question(p, q, age, ids, top_k)]
        for k in KS:
            out[k].append(
                1.0 if not q.evidence else len(q.evidence & set(ranked[:k])) / len(q.evidence)
            )
    return out


def grid(args: argparse.Namespace) -> list[Point]:
    points = []
    half_lives: list[float | None] = [None, 168.0, 720.0, 2160.0, 4320.0, 8760.0]
    for vec, hl in itertools.product(args.vectors.split(","), half_lives):
        if "rrf" in args.fusions:
            for k, wd in itertools.product(
                (1, 2, 3, 5, 10, 20, 30, 60, 120), (0.25, 0.5, 0.6, 0.75, 1.0)
            ):
                points.append(Point("rrf", k, wd, 1.0, vec, hl))
        if "weighted" in args.fusions:
            for wd in (0.25, 0.4, 0.5, 0.6, 0.75, 1.0, 1.5):
                points.append(Point("weighted", 60, wd, 1.0, vec, hl))
    return points


def sweep(args: argparse.Namespace) -> tuple[list[list[str]], int]:
    """Cross-validate the grid; the rows of the ``locomo-cv`` table and how many conversations."""
    with (Path(args.cache) / "locomo-dump.pkl").open("rb") as f:
        convs = pickle.load(f)
    prepared = [prepare(c, args.candidates) for c in convs]
    points = grid(args)
    # table[point][conv][k] = list of per-question recall
    table = [[score_conv(p, c, q) for c, q in zip(convs, prepared, strict=True)] for p in points]

    def mean_at(ti: int, convs_idx: Iterable[int], k: int) -> float:
        xs = [x for ci in convs_idx for x in table[ti][ci][k]]
        return 100 * statistics.mean(xs)

    names = [c["sample_id"] for c in convs]
    print(f"{len(points)} grid points, {len(convs)} conversations, candidates {args.candidates}")
    restrictions: list[tuple[str, Callable[[Point], bool]]] = [("all parameters", lambda p: True)]
    for hl in sorted({p.half_life_hours for p in points}, key=lambda h: h or 0.0):
        restrictions.append(
            (
                f"recency half-life {hl:g} h" if hl is not None else "recency off",
                lambda p, hl=hl: p.half_life_hours == hl,  # type: ignore[misc]
            )
        )
    restrictions.append(
        (
            "the shipped half-life and fusion",
            lambda p: p.half_life_hours == args.half_life and p.fusion == args.fusion,
        )
    )
    rows: list[list[str]] = []
    for label, select in restrictions:
        allowed = [i for i, p in enumerate(points) if select(p)]
        folds: dict[int, list[float]] = {k: [] for k in KS}
        chosen = []
        for held in range(len(convs)):
            train = [c for c in range(len(convs)) if c != held]
            best = max(allowed, key=lambda i: (mean_at(i, train, 10), mean_at(i, train, 5)))
            chosen.append((names[held], points[best].label()))
            for k in KS:
                folds[k].append(mean_at(best, [held], k))
        print(f"\n{label}: leave-one-conversation-out")
        for k in KS:
            xs = folds[k]
            print(
                f"  R@{k}: mean {statistics.mean(xs):.1f} (min {min(xs):.1f}, max {max(xs):.1f},"
                f" sd {statistics.stdev(xs):.1f})"
            )
        for held, lab in chosen:
            print(f"  fold {held}: chose {lab}")
        rows.append(
            [
                f"CV, {label}",
                *(
                    f"{statistics.mean(folds[k]):.1f} ({statistics.stdev(folds[k]):.1f})"
                    for k in KS
                ),
                " ".join(f"{x:.1f}" for x in folds[10]),
            ]
        )
        best_all = max(allowed, key=lambda i: (mean_at(i, range(len(convs)), 10),))
        print(
            f"  best on all five (plain dev, optimistic): {points[best_all].label()}: "
            + ", ".join(f"R@{k} {mean_at(best_all, range(len(convs)), k):.1f}" for k in KS)
        )
    print("\nnamed points (plain dev, all five; and per-conversation R@10):")
    for p in named_points(args):
        row = [score_conv(p, c, q) for c, q in zip(convs, prepared, strict=True)]
        overall = {k: 100 * statistics.mean([x for r in row for x in r[k]]) for k in KS}
        per = [100 * statistics.mean(r[10]) for r in row]
        print(
            f"  {p.label():60s} "
            + " ".join(f"R@{k} {overall[k]:.1f}" for k in KS)
            + "  ["
            + " ".join(f"{x:.1f}" for x in per)
            + "]"
        )
        rows.append(
            [
                f"dev, {p.label()}",
                *(f"{overall[k]:.1f}" for k in KS),
                " ".join(f"{x:.1f}" for x in per),
            ]
        )
    return rows, len(convs)


def write_results(
    rows: list[list[str]], conversations: int, candidates: int, *, path: Path = RESULTS
) -> None:
    """Replace RESULTS.md's ``locomo-cv`` section with a sweep's figures."""
    record(
        "locomo-cv",
        title="Recall's ranking parameters cross-validated on LoCoMo (`locomo_cv`)",
        data=f"the `dump` of {conversations} LoCoMo dev conversations, replayed in numpy;"
        f" {candidates} candidates a leg; each held-out conversation scored with the grid"
        " point best (R@10) on the others",
        header=["rows", *(f"R@{k}" for k in KS), "R@10 per conversation"],
        rows=rows,
        notes="CV rows: mean over the held-out conversations (sd); dev rows: the named"
        " point on all conversations (optimistic).",
        results=path,
    )


def named_points(args: argparse.Namespace) -> list[Point]:
    hl = args.half_life
    return [
        Point("rrf", 60, 0.0, 1.0, "nearer", hl),  # lexical alone
        Point("rrf", 60, 1.0, 0.0, "nearer", hl),  # dense alone
        Point("rrf", 60, 1.0, 1.0, "nearer", 168.0),  # the old defaults
        Point("rrf", 60, 1.0, 1.0, "nearer", None),
        Point(
            args.fusion, args.rrf_k, args.dense_weight, 1.0, args.dense_vector, hl
        ),  # the shipped defaults
        Point("weighted", 60, args.dense_weight, 1.0, args.dense_vector, hl),
        Point(args.fusion, args.rrf_k, args.dense_weight, 1.0, args.dense_vector, None),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="ingest and write the legs' lists")
    d.add_argument("path", help="locomo-dev.json (not shipped with the project)")
    d.add_argument("--cache", required=True, help="directory outside the repository")
    d.add_argument(
        "--model-path",
        default=os.environ.get("HARBOR_EMBED_MODEL_PATH", DEFAULT_MODEL),
        help="local MiniLM model directory (default: %(default)s)",
    )
    s = sub.add_parser("sweep", help="cross-validate the grid on the dump")
    s.add_argument("--cache", required=True)
    s.add_argument("--candidates", type=int, default=50, help="candidates per leg")
    s.add_argument("--half-life", type=float, default=168.0, help="the shipped half-life (h)")
    s.add_argument("--fusion", default="rrf", help="the shipped fusion")
    s.add_argument("--fusions", default="rrf,weighted", help="the fusions the grid holds")
    s.add_argument("--rrf-k", type=int, default=60)
    s.add_argument("--dense-weight", type=float, default=1.0)
    s.add_argument("--dense-vector", default="nearer")
    s.add_argument(
        "--vectors",
        default="nearer,mean",
        help="the dense leg's rules the grid holds (nearer of a turn's two vectors, their mean)",
    )
    s.add_argument(
        "--record", action="store_true", help="write the figures into benchmarks/RESULTS.md"
    )
    args = ap.parse_args()
    if args.cmd == "dump":
        with private_server() as (su, _base):
            server.bootstrap(su)
            migrate.upgrade(with_params(su, dbname="harbor", user="harbor_owner"))
            asyncio.run(dump(args, su))
    else:
        rows, conversations = sweep(args)
        if args.record:
            write_results(rows, conversations, args.candidates)


if __name__ == "__main__":
    main()
