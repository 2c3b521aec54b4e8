"""The inspector's chart numbers: each signal as a 0..1 bar, versions on one time axis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from harbor_pg.context.recall import RecallRequest
from harbor_pg.inspect.charts import signal_bars, timeline
from harbor_pg.owner import MemoryScope
from harbor_pg.ranking import RecalledMemory
from harbor_pg.records import Memory


def _item(**kw: object) -> RecalledMemory:
    values: dict[str, object] = {
        "memory": Memory(content="Dana owns ingest", importance=0.8),
        "rank": 1,
        "relevance": 0.1,
        "recency": 0.5,
        "entity": 0.25,
        "type_boost": 0.5,
        "score": 0.3,
        "tokens": 7,
        **kw,
    }
    return RecalledMemory(**values)  # type: ignore[arg-type]


def test_every_signal_is_a_bar_in_order_and_in_range() -> None:
    request = RecallRequest(query="q", scopes=(MemoryScope.USER,), top_k=6)
    bars = signal_bars(
        _item(dense_rank=1, similarity=0.9, lexical_rank=26, lexical_score=1.5), request, 0.2, 0.6
    )
    assert [b.label for b in bars] == [
        "dense rank", "lexical rank", "fused relevance", "recency", "importance",
        "entity", "type", "final score",
    ]  # fmt: skip
    by = {b.label: b for b in bars}
    assert by["dense rank"].fraction == 1.0  # rank 1 of the 50 a leg hands on
    assert by["lexical rank"].fraction == pytest.approx(25 / 50)
    assert by["fused relevance"].fraction == pytest.approx(0.5)  # against the best, 0.2
    assert by["importance"].fraction == pytest.approx(0.8)
    assert by["entity"].fraction == pytest.approx(0.5)  # 0.25 of the weight 0.5
    assert by["type"].fraction == pytest.approx(1.0)
    assert by["final score"].fraction == pytest.approx(0.5)
    assert "cos 0.900" in by["dense rank"].text and "bm25 1.500" in by["lexical rank"].text
    missing = signal_bars(_item(relevance=float("nan")), request, 0.2, 0.6)
    assert missing[0].text == "not a candidate" and missing[0].fraction == 0.0
    assert missing[2].fraction == 0.0  # a value that is not a number draws nothing


def test_versions_lie_on_one_axis_up_to_now() -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    now = t0 + timedelta(days=10)
    ticks = timeline([(t0, t0 + timedelta(days=5)), (t0 + timedelta(days=5), None)], now)
    assert (ticks[0].start, ticks[0].end, ticks[0].current) == (0.0, 0.5, False)
    assert (ticks[1].start, ticks[1].end, ticks[1].current) == (0.5, 1.0, True)
    assert timeline([], now) == []
