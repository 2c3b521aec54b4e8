"""The LoCoMo benchmarks survive a turn repeated word for word in a later session.

The store keeps one memory per distinct content, so the later copy comes back as
the earlier memory, dated at the earlier session: the benchmark's storing step
counts it as a repeat, maps both turns to that memory and checks only first
copies against their session's date (instead of stopping the run). Every LoCoMo
benchmark scores R@k with the same helpers: a repeat is found with its first
copy, and k counts results, not turn ids; the side-by-side benchmark applies the
same rule to peers that store both copies (no peer library needed here).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

from harbor_pg.db.connection import Database
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def bench(name: str) -> Any:
    # the benchmarks import the harness and each other by their bare names
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


def locomo() -> Any:
    return bench("locomo")


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

    # k counts memories: the first copy and Bob's turn fill a top 2, although they
    # stand for three turn ids
    [bob] = [m for m, ids in stored.dia_of.items() if ids == ["D2:1"]]
    found = bench.turns_found([first_copy, bob], stored.dia_of, 2)
    assert bench.recall_of(found, {"D2:1", "D2:2"}) == 1.0
    # the turn map a later run reads back from disk gives the same repeats
    kept = json.loads(json.dumps(stored.dia_of))
    order = [t.dia_id for t in stored.turns]
    assert bench.repeats_of(order, kept) == stored.repeats


async def test_peers_score_a_repeat_by_one_rule_for_every_system(database: Database) -> None:
    peers = bench("peers")
    manager = MemoryManager.from_database(database)
    harbor = peers.Harbor(database, database, manager, manager.recaller())
    conv = peers.conversation(SAMPLE)
    owner = peers.Owner("conv-t", conv, list(range(len(conv.memories))))
    await harbor.write(owner, batch=True)

    # harbor-pg stored rows 0 and 3 (D1:1, D2:2) as one memory
    copies = peers.copies_of(owner, harbor.rows)
    assert copies == {0: [0, 3], 3: [0, 3]}
    assert peers.repeats_in(owner, harbor.rows) == [("D2:2", "D1:1")]
    by_harbor = peers.turn_map(owner, harbor.rows, copies)
    [first_copy] = [m for m, ids in by_harbor.items() if ids == ["D1:1", "D2:2"]]
    [lovely] = [m for m, ids in by_harbor.items() if ids == ["D1:2"]]

    # mem0 stores every row under an id of its own; memnos by text, both copies
    by_mem0 = peers.turn_map(owner, {("conv-t", f"m{i}"): [i] for i in owner.rows}, copies)
    texts: dict[tuple[str, str], list[int]] = {}
    for i in owner.rows:
        texts.setdefault(("conv-t", conv.memories[i].content), []).append(i)
    by_memnos = peers.turn_map(owner, texts, copies)
    same_words = conv.memories[0].content

    def r_at(got: list[str], mapping: dict[str, list[str]], evidence: set[str], k: int) -> float:
        return float(peers.recall_of(peers.turns_found(got, mapping, k), evidence))

    # a question on the repeat, or on the first copy, is found by either copy's result
    for evidence in ({"D2:2"}, {"D1:1"}):
        assert r_at([first_copy], by_harbor, evidence, 1) == 1.0
        assert r_at(["m0"], by_mem0, evidence, 1) == 1.0
        assert r_at(["m3"], by_mem0, evidence, 1) == 1.0
        assert r_at([same_words], by_memnos, evidence, 1) == 1.0
    # k counts a system's results: harbor-pg's one memory takes one place; a peer
    # returning both copies spends two on the same words
    assert r_at([first_copy, lovely], by_harbor, {"D1:2"}, 2) == 1.0
    assert r_at(["m0", "m3", "m1"], by_mem0, {"D1:2"}, 2) == 0.0
    assert r_at(["m0", "m3", "m1"], by_mem0, {"D1:2"}, 3) == 1.0
    lovely_words = conv.memories[1].content
    assert r_at([same_words, same_words, lovely_words], by_memnos, {"D1:2"}, 2) == 0.0
    assert r_at([same_words, lovely_words], by_memnos, {"D1:2"}, 2) == 1.0
