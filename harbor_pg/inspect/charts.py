"""The numbers behind the inspector's charts: each ranking signal as a bar of 0..1.

Pure functions over :class:`~harbor_pg.inspect.data.RankingView`; the templates
draw the bars as inline SVG (no script, no style attribute: the page's
content security policy allows neither).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from harbor_pg.context.recall import RecallRequest
from harbor_pg.ranking import RecalledMemory

__all__ = ["Bar", "signal_bars", "timeline"]


@dataclass(frozen=True)
class Bar:
    """One signal of one memory: its label, the value as text and a 0..1 length."""

    label: str
    text: str
    fraction: float
    kind: str = "signal"


def _clamp(value: float) -> float:
    if not math.isfinite(value):
        return 0.0
    return min(max(value, 0.0), 1.0)


def _rank_bar(label: str, rank: int | None, pool: int, extra: str) -> Bar:
    if rank is None:
        return Bar(label, "not a candidate", 0.0, "rank")
    return Bar(label, f"#{rank}{extra}", _clamp((pool - rank + 1) / max(pool, 1)), "rank")


def signal_bars(
    item: RecalledMemory, request: RecallRequest, top_relevance: float, top_score: float
) -> list[Bar]:
    """The eight signals of ``item``: dense rank, lexical rank (a better rank is a
    longer bar, over the candidates each leg hands on), fused relevance and final
    score (against the best of the question), recency and importance (0..1),
    entity and type boosts (against their weights)."""
    pool = request.candidates_per_leg
    similarity = "" if item.similarity is None else f" (cos {item.similarity:.3f})"
    bm25 = "" if item.lexical_score is None else f" (bm25 {item.lexical_score:.3f})"
    relevance_text = f"{item.relevance:.4f}" + (" substring" if item.substring_match else "")
    importance = float(item.memory.importance)
    return [
        _rank_bar("dense rank", item.dense_rank, pool, similarity),
        _rank_bar("lexical rank", item.lexical_rank, pool, bm25),
        Bar("fused relevance", relevance_text, _clamp(item.relevance / (top_relevance or 1))),
        Bar("recency", f"{item.recency:.3f}", _clamp(item.recency)),
        Bar("importance", f"{importance:.2f}", _clamp(importance)),
        Bar("entity", f"{item.entity:.3f}", _clamp(item.entity / (request.entity_weight or 1))),
        Bar("type", f"{item.type_boost:.3f}", _clamp(item.type_boost / (request.type_weight or 1))),
        Bar("final score", f"{item.score:.4f}", _clamp(item.score / (top_score or 1)), "score"),
    ]


@dataclass(frozen=True)
class Tick:
    """One version on a supersession timeline: where it starts and ends (0..1)."""

    start: float
    end: float
    current: bool


def timeline(spans: list[tuple[datetime, datetime | None]], now: datetime) -> list[Tick]:
    """Each validity interval as a segment of one axis from the first start to now
    (an open interval runs to the end)."""
    if not spans:
        return []
    first = min(s for s, _ in spans)
    last = max([now, *[e for _, e in spans if e is not None]])
    width = max((last - first).total_seconds(), 1.0)
    out = []
    for start, end in spans:
        a = (start - first).total_seconds() / width
        b = 1.0 if end is None else (end - first).total_seconds() / width
        out.append(Tick(_clamp(a), _clamp(max(b, a + 0.01)), end is None))
    return out
