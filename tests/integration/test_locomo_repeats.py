"""The LoCoMo benchmark survives a turn repeated word for word in a later session.

The store keeps one memory per distinct content, so the later copy comes back as
the earlier memory, dated at the earlier session: the benchmark's storing step
counts it as a repeat, maps both turns to that memory and checks only first
copies against their session's date (instead of stopping the run).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def locomo() -> Any:
    # the benchmarks import the harness by its bare name
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import locomo as module

    return module


SAMPLE: dict[str, Any] = {
    "sample_id": "conv-t",
    "conversation": {
        "speaker_a": "Ann",
        "speaker_b": "Bob",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a cat called Miso."},
            {"speaker": "Bob", "dia_id": "D1:2", "text": "Lovely, what colour is she?"},
        ],
        "session_2_date_time": "10:37 am on 27 June, 2023",
        "session_2": [
            {"speaker": "Bob", "dia_id": "D2:1", "text": "How are things?"},
            # word for word the same as D1:1, weeks later
            {"speaker": "Ann", "dia_id": "D2:2", "text": "I adopted a cat called Miso."},
        ],
    },
    "qa": [
        {"question": "What is Ann's cat called?", "evidence": ["D2:2"], "category": 4},
        {"question": "What did Bob ask?", "evidence": ["D2:1"], "category": 4},
    ],
}


async def test_a_turn_repeated_in_a_later_session(database: Database) -> None:
    bench = locomo()
    manager = MemoryManager.from_database(database)
    owner = MemoryOwner(tenant_id="locomo", principal_id=SAMPLE["sample_id"])

    stored = await bench.store_conversation(
        manager, database, owner, SAMPLE, context=True, dated=True
    )

    assert stored.repeats == [("D2:2", "D1:1")]
    assert len(stored.turns) == 4
    # three memories, every first copy read back at its own session's date
    assert len(stored.dia_of) == 3
    assert stored.dated == 3
    [both] = [ids for ids in stored.dia_of.values() if len(ids) > 1]
    assert both == ["D1:1", "D2:2"]
    line = stored.describe(SAMPLE["qa"])
    assert line.startswith("1 repeated turn (D2:2 = D1:1)")
    assert "1 question citing a repeat scored against the first copy" in line

    # a question on the repeat is scored against the first copy, and k counts memories
    [first_copy] = [m for m, ids in stored.dia_of.items() if ids == ["D1:1", "D2:2"]]
    found = bench.turns_found([first_copy, "elsewhere"], stored.dia_of, 1)
    assert bench.recall_of(found, {"D2:2"}) == 1.0
