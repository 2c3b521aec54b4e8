"""The figures of the peers benchmark (benchmarks/_peers_metrics.py): completeness,
percentiles and ratios. Its R@10 and the mapping of results to turns are tested with
the repeated-turn conversation (tests/integration/test_locomo_repeats.py)."""

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
