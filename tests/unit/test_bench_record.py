"""Each benchmark's ``--record`` path writes its own section of RESULTS.md and nothing else.

The benchmarks are not run: each one's results writer is fed a small fake result
of the shape its run produces, against a copy of the real RESULTS.md, and the file
must come back with that section replaced (or appended, for a section the page
does not have yet) and every other byte as it was.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "RESULTS.md"


def bench(name: str) -> Any:
    # the benchmarks import the harness and each other by their bare names
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(name)


def _citus(path: Path) -> None:
    side = {
        "recall": [0.010, 0.020, 0.030],
        "search": [0.005, 0.006, 0.007],
        "append": [0.004, 0.005, 0.006],
        "recent": [0.002, 0.003, 0.004],
        "save": [0.008, 0.009, 0.010],
        "failed recalls": [0.0],
    }
    cluster = {k: [x * 4 for x in v] for k, v in side.items()} | {"failed recalls": [1.0]}
    bench("citus").write_results({"one server": side, "cluster": cluster}, 1000, 10, 3, path=path)


def _erasure(path: Path) -> None:
    bench("erasure_residue").write_results(
        [("after erase + CHECKPOINT", ["memories", "messages"], 2), ("after VACUUM (FULL)", [], 0)],
        20,
        path=path,
    )


def _load_run(clients: int) -> dict[str, Any]:
    return {
        "clients": clients,
        "pool": 4,
        "ops_s": 123.4,
        "per_op": {"append": (10.0, 20.0, 5), "recall": (11.0, 22.0, 3)},
        "pool_wait_ms": 0.5,
        "client_cpu_ms": 2.0,
        "server_cpu_ms": 2.5,
        "errors": [],
    }


def _load(path: Path) -> None:
    bench("load").write_results(
        [("mixed", _load_run(1)), ("pool size", _load_run(16))], 2.0, path=path
    )


def _load_start(path: Path) -> None:
    window = {
        "n": 40,
        "ops_s": 8.0,
        "p50": 100.0,
        "p99": 300.0,
        "max": 400.0,
        "window_ops": [6.0, 10.0],
    }
    bench("load").write_start_results(
        {
            "kinds": ["start", "none"],
            "start": window | {"errors": [], "lock_waits": 1},
            "none": window | {"errors": ["x"], "lock_waits": 0},
            "starts": ["1.2 s (0.8 s CPU)"],
            "compare_starts": [],
        },
        5.0,
        path=path,
    )


def _locomo(path: Path) -> None:
    bench("locomo").write_results(
        {
            "data": "1 conversation, 10 turns, 3 questions",
            "modes": {
                "dense": {5: 40.0, 10: 50.0, 25: 60.0, "p50_ms": 9.87},
                "hybrid": {5: 60.0, 10: 70.0, 25: 80.0, "p50_ms": 12.34},
            },
        },
        path=path,
    )


def _locomo_ab(path: Path) -> None:
    bench("locomo_ab").write_results(
        [
            [
                "hybrid",
                "93.0 / 91.9",
                "+0.9 ms",
                "17.36 / 17.33 (+0%)",
                "3 of 3",
                "60.0 / 70.0 / 80.0",
            ]
        ],
        "916da7d",
        path=path,
    )


def _locomo_cv(path: Path) -> None:
    bench("locomo_cv").write_results(
        [["CV, all parameters", "65.0 (3.0)", "76.0 (3.5)", "83.0 (3.2)", "80.1 77.0 70.2"]],
        3,
        50,
        path=path,
    )


def _recall_ab(path: Path) -> None:
    side = {"old_p50": 10.0, "new_p50": 11.0, "old_p99": 20.0, "new_p99": 22.0, "paired": -1.0}
    more = {"inside_old": "8.0 ms over 3 calls", "inside_new": "9.0 ms over 3 calls"}
    bench("_recall_ab").write_results(
        {"65d1186": side | more | {"same": 3, "n": 3}},
        "uniform 1,000,000 interleaved",
        3,
        path=path,
    )


WRITERS: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "citus": (
        _citus,
        [
            "| recall | 20.00 / ",
            "| recent | 3.00 / ",
            "| recalls answered empty (WARNING) | 0 of 3 | 1 of 3 |",
        ],
    ),
    "erasure-residue": (
        _erasure,
        ["| after erase + CHECKPOINT | memories, messages | 2 |", "| none | 0 |"],
    ),
    "load": (
        _load,
        ["| mixed | 1 | 4 | 123 | 10.0 / 20.0 | - | 11.0 / 22.0 | - |", "| pool size | 16 |"],
    ),
    "load-start": (
        _load_start,
        ["| start | 40 | 8 | 100.0 | 300.0 | 400 | 0 | 1 | - | 8 ± 3 |", "1.2 s (0.8 s CPU)"],
    ),
    "locomo": (
        _locomo,
        ["| hybrid | 60.0 | 70.0 | 80.0 | 12.3 |", "| dense | 40.0 | 50.0 | 60.0 | 9.9 |"],
    ),
    "locomo-ab": (_locomo_ab, ["| hybrid | 93.0 / 91.9 | +0.9 ms |", "old = 916da7d's recall SQL"]),
    "recall-ab": (
        _recall_ab,
        ["| 65d1186 | 10.00 / 11.00 (x1.10) | 20.00 / 22.00 | -1.00 ms |", "3 questions"],
    ),
    "locomo-cv": (
        _locomo_cv,
        ["| CV, all parameters | 65.0 (3.0) |", "3 LoCoMo dev conversations"],
    ),
}


def section(text: str, name: str) -> re.Match[str] | None:
    return re.search(
        rf"<!-- results:{re.escape(name)} -->.*?<!-- /results:{re.escape(name)} -->\n?", text, re.S
    )


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_record_replaces_only_its_own_section(name: str, tmp_path: Path) -> None:
    write, expected = WRITERS[name]
    before = RESULTS.read_text()
    copy = tmp_path / "RESULTS.md"
    copy.write_text(before)
    write(copy)
    after = copy.read_text()
    new = section(after, name)
    assert new is not None, f"no {name} section after --record"
    block = new.group(0)
    for line in expected:
        assert line in block, f"{line!r} not in the {name} section:\n{block}"
    assert "| commit |" in block and "| machine |" in block and "| date |" in block
    assert "| command |" in block and "| data |" in block
    old = section(before, name)
    if old is not None:
        # the rest of the page is byte for byte what it was, and the section moved nowhere
        assert after[: new.start()] == before[: old.start()]
        assert after[new.end() :] == before[old.end() :]
        assert block != old.group(0)
    else:
        # a section the page lacks is appended; everything before it stays
        assert after.startswith(before.rstrip("\n"))
        assert after.rstrip("\n").endswith(f"<!-- /results:{name} -->")
    # a second run replaces the section again instead of adding another
    write(copy)
    assert copy.read_text().count(f"<!-- results:{name} -->") == 1
    assert copy.read_text() == after
