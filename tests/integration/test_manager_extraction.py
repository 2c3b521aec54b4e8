"""MemoryManager.extract_memories: the seed-004 convenience, off by default."""

from __future__ import annotations

from typing import Any

import pytest

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.manager import MemoryManager, MemoryManagerConfig
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage
from harbor_pg.tiers.base import summary_memory_id

DANA = MemoryOwner(tenant_id="acme", principal_id="dana", session_id="s1")


class OneFactModel:
    """Proposes one fact per call: what the last user turn says about tea."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate_text(self, system: str, user: str) -> str:
        raise NotImplementedError

    async def generate_structured(self, system: str, user: str, schema: type[Any]) -> Any:
        self.calls += 1
        fact = {
            "content": "Dana drinks green tea every morning",
            "type": "preference",
            "scope": "user",
            "importance": 0.7,
            "entities": ["Dana"],
            "sensitivity": "none",
        }
        return schema.model_validate({"facts": [fact]})


async def test_off_by_default_and_needs_a_model(database: Database) -> None:
    manager = MemoryManager.from_database(database)
    with pytest.raises(MemoryConfigurationError, match="off"):
        await manager.extract_memories(DANA, model=OneFactModel())
    with pytest.raises(MemoryConfigurationError, match="model"):
        await manager.extract_memories(DANA, extract_facts=True)


async def test_extracts_once_and_a_retry_is_a_no_op(database: Database) -> None:
    manager = MemoryManager.from_database(database, embedder=HashingEmbedder())
    await manager.append(DANA, ConversationMessage(role="user", content="I drink green tea daily"))
    model = OneFactModel()
    ids = await manager.extract_memories(DANA, model=model, extract_facts=True)
    assert len(ids) == 1
    stored = await manager.get(DANA, ids[0])
    assert stored is not None
    assert stored.source == "extracted" and stored.source_session_id == "s1"
    assert await manager.extract_memories(DANA, model=model, extract_facts=True) == []
    assert model.calls == 2
    recalled = await manager.recall(DANA, "what does dana drink in the morning?")
    assert [m.id for m in recalled][:1] == ids


async def test_builders_summarise_sessions_in_the_background(database: Database) -> None:
    from harbor_pg.policy import MemoryPolicy

    policy = MemoryPolicy(summarise_after_turns=6, summary_cooldown_seconds=0)
    # appends schedule summaries too (tests/integration/test_append_summaries.py): off here,
    # so only the builder's scheduling is exercised
    manager = MemoryManager.from_database(
        database, policy=policy, config=MemoryManagerConfig(summarise_in_background=False)
    )
    for i in range(16):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"turn {i}: we talked about the budget review number {i}"
        await manager.append(DANA, ConversationMessage(role=role, content=text))
    assert manager.long_term is not None
    assert await manager.long_term.load_summary(DANA) is None  # type: ignore[attr-defined]
    # the turn's own build does not need a summary (the window fits) ...
    await manager.context_builder(background=None).build(DANA, "what did we discuss?")
    assert await manager.long_term.load_summary(DANA) is None  # type: ignore[attr-defined]
    # ... the background summariser writes one once enough turns have arrived
    await manager.context_builder().build(DANA, "what did we discuss?")
    await manager.background_summarizer(policy=policy).drain()
    summary = await manager.long_term.load_summary(DANA)  # type: ignore[attr-defined]
    assert summary is not None and summary.memory_type.value == "summary"
    assert summary.id == summary_memory_id(DANA)
    raw = await manager.recent(DANA, 50)
    assert len(raw) == 16  # raw turns are kept
