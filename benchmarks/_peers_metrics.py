"""The figures ``benchmarks/peers.py`` reports, as pure functions (unit-tested on their own).

Nothing here touches a database or a peer library: lists of what a system
returned go in, numbers come out. R@k is scored with ``benchmarks/locomo.py``'s
helpers (``turns_found``, ``recall_of``), as the other LoCoMo benchmarks score it.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Sequence


def completeness(returned: Sequence[Hashable], exact: Sequence[Hashable], k: int = 25) -> float:
    """The share of the exact top ``k`` that ``returned`` holds (1.0 when the exact
    answer is empty: nothing was missed). Order does not matter, duplicates count once."""
    wanted = set(list(exact)[:k])
    if not wanted:
        return 1.0
    return len(wanted & set(returned)) / len(wanted)


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile of ``values`` (p in 0..100)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def latency_ms(values: Sequence[float]) -> tuple[float, float]:
    """(p50, p99) in milliseconds of latencies given in seconds."""
    ms = [v * 1000 for v in values]
    return statistics.median(ms), percentile(ms, 99)


def ratio(ours: float, theirs: float) -> str:
    """``ours / theirs`` as ``0.62x`` (``-`` when either side is missing or zero)."""
    if not ours or not theirs:
        return "-"
    return f"{ours / theirs:.2f}x"
