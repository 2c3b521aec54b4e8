"""Observations: what several facts about one entity add up to, written by a model, with
the ids of the facts it read, superseded when those facts change; on both stores."""

from __future__ import annotations

from typing import Any

import pytest

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryValidationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory, MemoryType
from harbor_pg.tiers.in_process import InMemoryLongTermStore

ALICE = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="alice", session_id="s1")
BOB = MemoryOwner(tenant_id="t1", project_id="p1", principal_id="bob", session_id="s1")
HARBOUR = "place:harbour"
FACTS = (
    "The harbour opens at six",
    "The harbour has a ferry to the island",
    "The harbour cafe sells fresh fish",
)


class Observer:
    """A scripted model: one sentence naming how many facts it read."""

    def __init__(self, answer: str | None = None) -> None:
        self.calls: list[str] = []
        self.answer = answer

    async def generate_text(self, system: str, user: str) -> str:
        self.calls.append(user)
        if self.answer is not None:
            return self.answer
        return f"The harbour is a busy place ({user.count('- ')} facts)"

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        raise NotImplementedError


async def _managers(database: Database) -> list[MemoryManager]:
    return [
        MemoryManager.from_database(database, embedder=HashingEmbedder()),
        MemoryManager(long_term=InMemoryLongTermStore()),
    ]


@pytest.mark.parametrize("store", ["postgres", "in_process"])
async def test_observations_read_facts_and_are_superseded_when_they_change(
    database: Database, store: str
) -> None:
    manager = (await _managers(database))[0 if store == "postgres" else 1]
    saved = await manager.save_many(
        ALICE, [Memory(content=text, entity_ids=[HARBOUR], importance=0.6) for text in FACTS]
    )
    # two facts about another entity, and Bob's facts about the harbour: not enough, not hers
    await manager.save_many(
        ALICE, [Memory(content=f"Tea fact {i}", entity_ids=["thing:tea"]) for i in range(2)]
    )
    await manager.save_many(
        BOB, [Memory(content=f"Bob's harbour {i}", entity_ids=[HARBOUR]) for i in range(4)]
    )
    model = Observer()
    [first] = await manager.observe(ALICE, model=model)
    assert first.memory_type is MemoryType.OBSERVATION and first.entity_ids == [HARBOUR]
    assert first.content == "The harbour is a busy place (3 facts)"
    assert first.source == "reflection" and first.importance == pytest.approx(0.6)
    assert first.metadata["observed_ids"] == sorted(s.memory.id for s in saved)
    assert all(text in model.calls[0] for text in FACTS)
    # nothing changed: no call, nothing written
    assert await manager.observe(ALICE, model=model) == [] and len(model.calls) == 1
    # a fact is added: a new observation supersedes the old
    await manager.save(ALICE, Memory(content="The harbour floods in spring", entity_ids=[HARBOUR]))
    [second] = await manager.observe(ALICE, model=model)
    assert second.content == "The harbour is a busy place (4 facts)"
    assert len(second.metadata["observed_ids"]) == 4
    old = await manager.get(ALICE, first.id or "")
    assert old is not None and old.superseded_by == second.id and old.invalid_at is not None
    # recall asks for them by type, or leaves them out
    found = await manager.recall(ALICE, "harbour", wanted_types=["observation"], top_k=3)
    assert found[0].id == second.id
    without = await manager.recall(ALICE, "harbour", excluded_types=["observation"], top_k=3)
    assert len(without) == 3
    assert all(m.memory_type is not MemoryType.OBSERVATION for m in without)
    assert second.id in {m.id for m in await manager.recall(ALICE, "harbour", top_k=10)}
    # Bob's own facts make his own observation
    [bobs] = await manager.observe(BOB, model=model)
    assert bobs.user_id == "bob" and bobs.content.endswith("(4 facts)")


async def test_a_model_that_answers_nothing_writes_nothing(database: Database) -> None:
    manager = MemoryManager(long_term=InMemoryLongTermStore())
    await manager.save_many(ALICE, [Memory(content=t, entity_ids=[HARBOUR]) for t in FACTS])
    assert await manager.observe(ALICE, model=Observer(answer="   ")) == []
    with pytest.raises(MemoryValidationError):
        await manager.observe(ALICE, model=Observer(), min_facts=1)
