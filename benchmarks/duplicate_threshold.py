"""Calibrating an embedder's near-duplicate threshold (the one consolidation merges at).

    python -m benchmarks duplicate_threshold PATH/locomo-dev.json [--embedders minilm,hashing]
                                             [--cache DIR] [--restate 0.5] [--seed 7]
                                             [--record]

Consolidation merges two current memories of one owner whose content vectors are at
least a threshold similar. Where that threshold sits depends on the embedder: its
cosines of restatements and of distinct facts fall in ranges of their own. This
measures them on the LoCoMo dev conversations, with no database:

- restatements: each turn and each of its restatements, made by the consolidation
  benchmark's generator with the same seed (``benchmarks/consolidation.py``: case and
  punctuation, or a filler phrase before or after);
- distinct facts: every pair of two different turns of one conversation (one owner).

Pairs whose texts are the same once case and punctuation are set aside are left out
on both sides: consolidation merges those by text whatever the threshold. A pair is
merged when its cosine is at or above the threshold; precision is the share of merged
pairs that are restatements, recall the share of restatements merged. The threshold
chosen is the one of highest F1 on a grid of 0.005; the cross-validated figure
chooses it on four conversations and scores it on the fifth, for each conversation
in turn (leave one conversation out), and pools the held-out counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, record
from _embed_cache import CachedEmbedder
from consolidation import restated
from locomo import DEFAULT_MODEL, turns_of

from harbor_pg.consolidation import loose_text
from harbor_pg.embedders.fastembed import FastEmbedEmbedder
from harbor_pg.embedders.hashing import HashingEmbedder

QUESTION = "At what cosine does an embedder tell a restated fact from a distinct one?"

GRID = np.round(np.arange(0.50, 1.0001, 0.005), 3)


@dataclass
class Pairs:
    """One conversation's cosines: restatement pairs and distinct-turn pairs."""

    name: str
    same: np.ndarray[Any, Any]
    distinct: np.ndarray[Any, Any]


def counts(pairs: list[Pairs], t: float) -> tuple[int, int, int]:
    """(restatements merged, distinct pairs merged, restatements) at threshold ``t``."""
    tp = sum(int((p.same >= t).sum()) for p in pairs)
    fp = sum(int((p.distinct >= t).sum()) for p in pairs)
    return tp, fp, sum(len(p.same) for p in pairs)


def scores(tp: int, fp: int, n: int) -> tuple[float, float, float]:
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / n if n else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def best(pairs: list[Pairs]) -> float:
    """The grid's threshold of highest F1 on ``pairs`` (the higher one on a tie)."""
    f1s = [scores(*counts(pairs, float(t)))[2] for t in GRID]
    top = max(f1s)
    return float(max(t for t, f in zip(GRID, f1s, strict=True) if f == top))


async def conversation_pairs(
    sample: dict[str, Any], rng: random.Random, embedder: Any, restate: float
) -> Pairs:
    turns = turns_of(sample)
    # the consolidation benchmark's draws, in its order, so the restatements are its own
    same_texts: list[tuple[int, str]] = []
    for i, turn in enumerate(turns):
        if rng.random() >= restate or turn.valid_from is None:
            continue
        for _k in range(rng.randint(1, 3)):
            same_texts.append((i, restated(turn.text, rng)))
            rng.uniform(1, 120)
    texts = [t.text for t in turns]
    vectors = np.asarray(await embedder.embed(texts + [s for _i, s in same_texts]))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    turn_v, same_v = vectors[: len(texts)], vectors[len(texts) :]
    loose = [loose_text(t) for t in texts]
    same = [
        float(turn_v[i] @ same_v[j])
        for j, (i, text) in enumerate(same_texts)
        if loose_text(text) != loose[i]
    ]
    cos = turn_v @ turn_v.T
    upper = np.triu_indices(len(texts), k=1)
    keep = np.array([loose[a] != loose[b] for a, b in zip(*upper, strict=True)], dtype=bool)
    return Pairs(sample["sample_id"], np.asarray(same), cos[upper][keep])


async def run(args: argparse.Namespace, which: str) -> dict[str, Any]:
    data = json.loads(Path(args.path).read_text())
    rng = random.Random(args.seed)
    embedder: Any
    if which == "hashing":
        embedder = HashingEmbedder()
    else:
        embedder = FastEmbedEmbedder(model_path=args.model_path, model_id="minilm-l6-int8")
        if args.cache:
            embedder = CachedEmbedder(embedder, args.cache)
    pairs = [await conversation_pairs(s, rng, embedder, args.restate) for s in data]
    if isinstance(embedder, CachedEmbedder):
        embedder.save()
    chosen = best(pairs)
    plain = scores(*counts(pairs, chosen))
    held: list[tuple[str, float, tuple[float, float, float]]] = []
    tp = fp = n = 0
    for i, out in enumerate(pairs):
        t = best(pairs[:i] + pairs[i + 1 :])
        c = counts([out], t)
        tp, fp, n = tp + c[0], fp + c[1], n + c[2]
        held.append((out.name, t, scores(*c)))
    cv = scores(tp, fp, n)
    same = np.concatenate([p.same for p in pairs])
    distinct = np.concatenate([p.distinct for p in pairs])
    print(f"machine: {machine()}")
    print(f"embedder {embedder.model_id}: {len(same)} restatement pairs, {len(distinct)} distinct")
    print(
        f"cosine, restatements: median {np.median(same):.3f}, 5th pct {np.percentile(same, 5):.3f};"
        f" distinct: median {np.median(distinct):.3f}, 99.99th pct"
        f" {np.percentile(distinct, 99.99):.3f}, max {distinct.max():.3f}"
    )
    for t in (0.85, 0.88, 0.9, 0.92, 0.95, chosen):
        p, r, f = scores(*counts(pairs, t))
        print(f"  {t:.3f}: precision {p:.3f} recall {r:.3f} F1 {f:.3f}")
    print(f"chosen {chosen:.3f}: precision {plain[0]:.3f} recall {plain[1]:.3f} F1 {plain[2]:.3f}")
    for name, t, (p, r, _f) in held:
        print(f"  held out {name}: threshold {t:.3f}, precision {p:.3f} recall {r:.3f}")
    print(f"leave one conversation out: precision {cv[0]:.3f} recall {cv[1]:.3f} F1 {cv[2]:.3f}")
    return {
        "model_id": embedder.model_id,
        "same": len(same),
        "distinct": len(distinct),
        "chosen": chosen,
        "plain": plain,
        "cv": cv,
        "held": held,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("path", help="locomo-dev.json (not shipped with the project)")
    ap.add_argument("--embedders", default="minilm,hashing", help="minilm and/or hashing")
    ap.add_argument("--cache", default=os.environ.get("HARBOR_BENCH_CACHE", ""))
    ap.add_argument("--restate", type=float, default=0.5, help="share of turns restated")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--model-path", default=os.environ.get("HARBOR_EMBED_MODEL_PATH", DEFAULT_MODEL)
    )
    ap.add_argument("--record", action="store_true", help="write the figures into RESULTS.md")
    args = ap.parse_args()
    which = [w.strip() for w in args.embedders.split(",") if w.strip()]
    if not which or any(w not in ("minilm", "hashing") for w in which):
        ap.error("--embedders takes minilm and/or hashing")
    runs = [asyncio.run(run(args, w)) for w in which]
    if args.record:
        s = runs[0]
        f3 = lambda x: f"{x:.3f}"  # noqa: E731
        record(
            "duplicate-threshold",
            title="Near-duplicate thresholds per embedder (`duplicate_threshold`)",
            data=f"the LoCoMo dev conversations: {s['same']:,} pairs of a turn and its"
            " restatement (the consolidation benchmark's generator, seed"
            f" {args.seed}) against {s['distinct']:,} pairs of two turns of one"
            " conversation; pairs equal by text left out",
            header=[
                "embedder",
                "threshold",
                "precision / recall / F1",
                "leave one conversation out: precision / recall / F1",
            ],
            rows=[
                [
                    r["model_id"],
                    f3(r["chosen"]),
                    " / ".join(map(f3, r["plain"])),
                    " / ".join(map(f3, r["cv"])),
                ]
                for r in runs
            ],
            notes="Chosen by F1 on a grid of 0.005; the held-out thresholds (chosen on the"
            " other four conversations): "
            + "; ".join(
                r["model_id"] + " " + ", ".join(f"{name} {t:.3f}" for name, t, _s in r["held"])
                for r in runs
            )
            + ". The restatements keep the turn's words (a filler phrase, or case and"
            " punctuation):\nparaphrases in other words are not measured here.",
        )


if __name__ == "__main__":
    main()
