"""The figures of the peers benchmark (benchmarks/_peers_metrics.py): completeness, R@k,
the mapping of results to dialogue turns, percentiles and ratios."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "_peers_metrics.py"
_spec = importlib.util.spec_from_file_location("_peers_metrics", _PATH)
assert _spec is not None and _spec.loader is not None
metrics = importlib.util.module_from_spec(_spec)
sys.modules["_peers_metrics"] = metrics
_spec.loader.exec_module(metrics)


def test_completeness_is_the_share_of_the_exact_top_k_returned() -> None:
    exact = [f"m{i}" for i in range(30)]
    assert metrics.completeness(exact[:25], exact, 25) == 1.0
    assert metrics.completeness(exact[:5], exact, 25) == pytest.approx(5 / 25)
    # order and extra rows do not matter; rows beyond the exact top k earn nothing
    assert metrics.completeness([*list(reversed(exact[:25])), "x"], exact, 25) == 1.0
    assert metrics.completeness(exact[25:], exact, 25) == 0.0
    # a short exact answer is the whole target
    assert metrics.completeness(["a"], ["a", "b"], 25) == 0.5
    assert metrics.completeness([], [], 25) == 1.0
    assert metrics.completeness(["a", "a"], ["a", "b"], 25) == 0.5


def test_recall_at_k_counts_evidence_in_the_first_k() -> None:
    ranked = ["D1:1", "D1:2", "D2:7", "D3:1"]
    assert metrics.recall_at(ranked, {"D1:2", "D3:1"}, 2) == 0.5
    assert metrics.recall_at(ranked, {"D1:2", "D3:1"}, 10) == 1.0
    assert metrics.recall_at(ranked, {"D9:9"}, 10) == 0.0
    assert metrics.recall_at(ranked, set(), 10) == 1.0


def test_dialogue_ids_map_results_in_order_once() -> None:
    mapping = {"a": ["D1:1"], "b": ["D1:2", "D4:4"], "c": ["D1:1"]}
    assert metrics.dialogue_ids(["b", "zzz", "c", "a"], mapping) == ["D1:2", "D4:4", "D1:1"]
    assert metrics.dialogue_ids([], mapping) == []


def test_percentiles_and_ratios() -> None:
    values = [0.001 * i for i in range(1, 101)]  # 1 .. 100 ms
    p50, p99 = metrics.latency_ms(values)
    assert p50 == pytest.approx(50.5)
    assert p99 == pytest.approx(99.0)
    assert metrics.percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        metrics.percentile([], 50)
    assert metrics.ratio(1.0, 4.0) == "0.25x"
    assert metrics.ratio(0.0, 4.0) == "-"
    assert metrics.ratio(2.0, 0.0) == "-"
