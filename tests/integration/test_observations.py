"""Observations: what several facts about one entity add up to, written by a model, with
the ids of the facts it read, superseded when those facts change; on both stores."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryValidationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import Memory, MemoryType
from harbor_pg.tiers.in_process import InMemoryLongTermStore
from tests.conftest import PgDatabase

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


class Failing(Observer):
    """A scripted model that always fails."""

    async def generate_text(self, system: str, user: str) -> str:
        self.calls.append(user)
        raise RuntimeError("the model is down")


@pytest.mark.parametrize("store", ["postgres", "in_process"])
async def test_an_observation_whose_entity_falls_below_min_facts_is_closed(
    database: Database, store: str
) -> None:
    manager = (await _managers(database))[0 if store == "postgres" else 1]
    soon = datetime.now(UTC) + timedelta(seconds=1.5)
    await manager.save_many(
        ALICE,
        [
            Memory(content=text, entity_ids=[HARBOUR], expires_at=soon if i == 0 else None)
            for i, text in enumerate(FACTS)
        ],
    )
    [observation] = await manager.observe(ALICE, model=Observer())
    written = datetime.now(UTC)
    await asyncio.sleep(max(0.0, (soon - datetime.now(UTC)).total_seconds()) + 0.2)
    # one fact expired: two are left, fewer than min_facts; no model is asked
    model = Observer()
    assert await manager.observe(ALICE, model=model) == [] and model.calls == []
    closed = await manager.get(ALICE, observation.id or "")
    assert closed is not None and closed.invalid_at is not None
    assert closed.superseded_by is None  # closed, not replaced
    current = await manager.current_memories(ALICE, ["user"])
    assert all(m.memory_type is not MemoryType.OBSERVATION for m in current)
    found = await manager.recall(ALICE, "harbour", wanted_types=["observation"], top_k=10)
    assert observation.id not in {m.id for m in found}
    # add-only: as of before, it was current
    before = await manager.recall(ALICE, "harbour busy place", as_of=written, top_k=10)
    assert observation.id in {m.id for m in before}
    # a second run has nothing to close
    assert await manager.observe(ALICE, model=model) == [] and model.calls == []


@pytest.mark.parametrize("store", ["postgres", "in_process"])
async def test_an_observation_that_read_a_fact_no_longer_current_does_not_linger(
    database: Database, store: str
) -> None:
    manager = (await _managers(database))[0 if store == "postgres" else 1]
    await manager.save_many(ALICE, [Memory(content=t, entity_ids=[HARBOUR]) for t in FACTS])
    [observation] = await manager.observe(ALICE, model=Observer())
    # a fact added and the model down: what the observation read still holds, it stays
    await manager.save(ALICE, Memory(content="The harbour floods in spring", entity_ids=[HARBOUR]))
    failing = Failing()
    assert await manager.observe(ALICE, model=failing) == [] and len(failing.calls) == 1
    kept = await manager.get(ALICE, observation.id or "")
    assert kept is not None and kept.invalid_at is None
    # a fact it read is merged away (consolidation supersedes it): four facts are still
    # current, but the observation read one that is not; the model down, it is closed
    await manager.save(ALICE, Memory(content="the harbour OPENS at six!", importance=0.9))
    [merge] = (await manager.consolidate(ALICE)).merges
    assert set(merge.merged_ids) & set(observation.metadata["observed_ids"])
    assert await manager.observe(ALICE, model=failing) == []
    closed = await manager.get(ALICE, observation.id or "")
    assert closed is not None and closed.invalid_at is not None and closed.superseded_by is None
    # with the model back, the entity gets a new observation of its current facts
    [again] = await manager.observe(ALICE, model=Observer())
    assert again.content == "The harbour is a busy place (4 facts)"


async def test_excluded_types_take_no_candidates_place(
    database: Database, fresh_db: PgDatabase
) -> None:
    embedder = HashingEmbedder()
    manager = MemoryManager.from_database(database, embedder=embedder)
    # observations that match the question better than the one fact, in both legs
    await manager.save_many(
        ALICE,
        [
            Memory(
                content=f"Observed {i}: the harbour ferry leaves the harbour, the harbour ferry",
                memory_type=MemoryType.OBSERVATION,
                entity_ids=[HARBOUR],
            )
            for i in range(60)
        ],
    )
    [fact] = await manager.save_many(ALICE, [Memory(content="Alice once took a ferry")])
    vector = "[" + ",".join(map(str, await embedder.embed_query("harbour ferry"))) + "]"
    with psycopg.connect(fresh_db.app_url, autocommit=True) as app:
        app.execute(
            "select harbor.set_identity('t1', project_id => 'p1', principal_id => 'alice',"
            " session_id => 's1')"
        )

        def recalled(excluded: str) -> list[str]:
            rows = app.execute(
                "select id, memory_type from harbor.recall('harbour ferry', %s::vector, %s,"
                " top_k => 3, excluded_types => %s::harbor.memory_type[])",
                (vector, embedder.model_id, excluded),
            ).fetchall()
            return [str(r[0]) for r in rows]

        # each leg hands over 50 candidates (at least): the observations fill them
        assert fact.memory.id not in recalled("{}")
        # left out by the legs, they take no candidate's place: the fact is found
        assert recalled("{observation}") == [fact.memory.id]
