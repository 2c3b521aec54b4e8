"""Tier objects under seed 000's names: each wraps one store.

harborrag-memory wires its facade with tier objects
(``MemoryManager(working=WorkingMemory(InMemoryWorkingMemoryStore()))``);
harbor-pg's :class:`~harbor_pg.manager.MemoryManager` takes the stores
themselves. These thin wrappers let code written for the seed run after
changing one import: the manager unwraps them (:func:`unwrap_store`), and each
also offers its tier's methods directly.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from harbor_pg.owner import MemoryOwner
from harbor_pg.ranking import RecalledMemory, RecallRequest
from harbor_pg.records import ConversationMessage, Memory
from harbor_pg.tiers.base import LongTermStore, SaveResult, ShortTermStore, WorkingStore
from harbor_pg.tiers.in_process import (
    InMemoryLongTermStore,
    InMemoryShortTermStore,
    InMemoryWorkingStore,
)

__all__ = [
    "InMemoryConversationStore",
    "InMemoryMemoryRepository",
    "InMemoryWorkingMemoryStore",
    "LongTermMemory",
    "ShortTermMemory",
    "WorkingMemory",
    "unwrap_store",
]


class InMemoryWorkingMemoryStore(InMemoryWorkingStore):
    """Seed 000's name for :class:`~harbor_pg.tiers.in_process.InMemoryWorkingStore`."""


class InMemoryConversationStore(InMemoryShortTermStore):
    """Seed-style name for :class:`~harbor_pg.tiers.in_process.InMemoryShortTermStore`."""


class InMemoryMemoryRepository(InMemoryLongTermStore):
    """Seed-style name for :class:`~harbor_pg.tiers.in_process.InMemoryLongTermStore`."""


# The three tiers below share one shape on purpose: each is a typed, documented
# forwarder to its own store protocol, with its own in-process default.
class _Tier:
    """A tier object: one store, reachable as ``.store``."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.store).__name__})"


# Same shape as the other tiers here, on purpose (see _Tier).
class ShortTermMemory(_Tier):
    """The short-term tier (conversation turns) over a :class:`ShortTermStore`."""

    store: ShortTermStore

    def __init__(self, store: ShortTermStore | None = None) -> None:
        super().__init__(store if store is not None else InMemoryShortTermStore())

    async def append(self, owner: MemoryOwner, turn: ConversationMessage) -> ConversationMessage:
        """Store one turn (unvalidated; :meth:`MemoryManager.append` validates)."""
        return await self.store.append(owner, turn)

    async def recent(self, owner: MemoryOwner, limit: int = 50) -> list[ConversationMessage]:
        """The newest ``limit`` turns, oldest first."""
        return await self.store.recent(owner, limit)

    async def clear(self, owner: MemoryOwner) -> int:
        """Delete the session's turns; how many."""
        return await self.store.clear(owner)


# Same shape as the other tiers here, on purpose (see _Tier).
class WorkingMemory(_Tier):
    """The working tier (per-run scratch state with a TTL) over a :class:`WorkingStore`."""

    store: WorkingStore

    def __init__(self, store: WorkingStore | None = None) -> None:
        super().__init__(store if store is not None else InMemoryWorkingStore())

    async def scratch(self, owner: MemoryOwner) -> dict[str, Any]:
        """The run's working state ({} when none or expired)."""
        return await self.store.get(owner)

    async def update(
        self, owner: MemoryOwner, state: dict[str, Any], ttl_seconds: float | None = None
    ) -> dict[str, Any]:
        """Merge ``state`` into the run's working state; the result."""
        return await self.store.update(owner, state, ttl_seconds)

    async def clear(self, owner: MemoryOwner) -> int:
        """Delete the run's working state."""
        return await self.store.clear(owner)


# Same shape as the other tiers here, on purpose (see _Tier).
class LongTermMemory(_Tier):
    """The long-term tier (durable memories) over a :class:`LongTermStore`."""

    store: LongTermStore

    def __init__(self, store: LongTermStore | None = None) -> None:
        super().__init__(store if store is not None else InMemoryLongTermStore())

    async def save(self, caller: MemoryOwner, memory: Memory) -> SaveResult:
        """Store ``memory`` under ``caller`` narrowed to its scope."""
        return await self.store.save(caller, memory)

    async def get(self, caller: MemoryOwner, memory_id: str) -> Memory | None:
        """One memory the caller may see, or None."""
        return await self.store.get(caller, memory_id)

    async def search(
        self, caller: MemoryOwner, query: str, *, limit: int = 10, as_of: datetime | None = None
    ) -> list[Memory]:
        """Memories visible to ``caller`` that match ``query``."""
        return await self.store.search(caller, query, limit=limit, as_of=as_of)

    async def delete(self, caller: MemoryOwner, memory_id: str) -> bool:
        """Delete one of the caller's own memories."""
        return await self.store.delete(caller, memory_id)

    async def recall(self, caller: MemoryOwner, request: RecallRequest) -> list[RecalledMemory]:
        """The memories ``request`` recalls for ``caller``, ranked."""
        return await self.store.recall(caller, request)


def unwrap_store(tier: Any) -> Any:
    """The store inside a tier object, or ``tier`` itself when it is already a store."""
    return tier.store if isinstance(tier, _Tier) else tier
