"""Erasure is part of the store protocol: a store that cannot erase fails loudly."""

from __future__ import annotations

from typing import Any

import pytest

from harbor_pg.errors import MemoryConfigurationError
from harbor_pg.manager import MemoryManager
from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.tiers.base import ErasureSubject
from harbor_pg.tiers.in_process import InMemoryLongTermStore, InMemoryShortTermStore

ALICE = MemoryOwner(tenant_id="t1", principal_id="alice", session_id="s1")


class TurnsWithoutErase:
    """A custom short-term store that implements everything but erase()."""

    def __init__(self) -> None:
        self.inner = InMemoryShortTermStore()

    def __getattr__(self, name: str) -> Any:
        if name == "erase":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def append(self, owner: MemoryOwner, message: ConversationMessage) -> Any:
        return await self.inner.append(owner, message)

    async def recent(self, owner: MemoryOwner, limit: int) -> Any:
        return await self.inner.recent(owner, limit)


class CustomTurns:
    """A custom store with its own erase (delegating, as a real one would implement it)."""

    def __init__(self) -> None:
        self.inner = InMemoryShortTermStore()
        self.erased: list[ErasureSubject] = []

    async def append(self, owner: MemoryOwner, message: ConversationMessage) -> Any:
        return await self.inner.append(owner, message)

    async def recent(self, owner: MemoryOwner, limit: int) -> Any:
        return await self.inner.recent(owner, limit)

    async def erase(self, subject: ErasureSubject) -> list[int]:
        self.erased.append(subject)
        return await self.inner.erase(subject)


async def test_erase_over_a_store_that_cannot_erase_fails_and_deletes_nothing() -> None:
    long_term = InMemoryLongTermStore()
    manager = MemoryManager(short_term=TurnsWithoutErase(), long_term=long_term)  # type: ignore[arg-type]
    await manager.append(ALICE, ConversationMessage(role="user", content="my code is 4711"))
    await manager.save(ALICE, Memory(content="alice fact"))
    with pytest.raises(MemoryConfigurationError, match=r"TurnsWithoutErase.*cannot erase"):
        await manager.erase("t1", user_id="alice")
    # nothing was deleted in the stores that could have erased
    assert [m.content for m in await manager.search(ALICE, "alice")] == ["alice fact"]
    assert len(await manager.recent(ALICE)) == 1


async def test_erase_calls_a_custom_stores_erase_and_counts_it() -> None:
    turns = CustomTurns()
    manager = MemoryManager(short_term=turns, long_term=InMemoryLongTermStore())  # type: ignore[arg-type]
    turn = await manager.append(ALICE, ConversationMessage(role="user", content="my code is 4711"))
    await manager.save(
        ALICE, Memory(content="alice's code is 4711", source_message_ids=[str(turn.id)])
    )
    receipt = await manager.erase("t1", user_id="alice")
    assert turns.erased == [ErasureSubject(tenant_id="t1", user_id="alice")]
    assert (receipt.short_term, receipt.long_term) == (1, 1)
    assert await manager.recent(ALICE) == []
