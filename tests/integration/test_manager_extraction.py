"""MemoryManager.extract_memories: the seed-004 convenience, off by default."""

from __future__ import annotations

from typing import Any

import pytest

from harbor_pg.db.connection import Database
from harbor_pg.embedders.hashing import HashingEmbedder
from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage

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
