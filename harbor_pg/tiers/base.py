"""The store seam: small protocols any backend implements.

The PostgreSQL stores and the in-process stores both satisfy these, and
``harbor_pg.testing.conformance`` proves a store of your own behaves the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage, Memory

__all__ = [
    "EraseReceipt",
    "LongTermStore",
    "SaveResult",
    "ShortTermStore",
    "WorkingStore",
]


@dataclass(frozen=True)
class SaveResult:
    """Outcome of a save: the stored memory, and whether this call created it."""

    memory: Memory
    created: bool


@dataclass(frozen=True)
class EraseReceipt:
    """What an erasure deleted, per tier (no content, only counts)."""

    short_term: int
    working: int
    long_term: int
    embeddings: int

    @property
    def total(self) -> int:
        return self.short_term + self.working + self.long_term + self.embeddings


@runtime_checkable
class ShortTermStore(Protocol):
    """Conversation turns of one session (tenant, user, session)."""

    async def append(self, owner: MemoryOwner, message: ConversationMessage) -> ConversationMessage:
        """Store one turn; return it with ``id`` and ``created_at`` set."""
        ...

    async def recent(self, owner: MemoryOwner, limit: int) -> list[ConversationMessage]:
        """The newest ``limit`` turns, oldest first."""
        ...

    async def after(
        self, owner: MemoryOwner, after_id: int, limit: int, before_id: int | None = None
    ) -> list[ConversationMessage]:
        """Up to ``limit`` turns with ``after_id < id (< before_id)``, oldest first."""
        ...

    async def count(self, owner: MemoryOwner) -> int:
        """How many turns the session holds."""
        ...

    async def clear(self, owner: MemoryOwner) -> int:
        """Delete the session's turns; return how many."""
        ...


@runtime_checkable
class WorkingStore(Protocol):
    """Per-run scratch state with an optional time to live."""

    async def get(self, owner: MemoryOwner) -> dict[str, Any]:
        """The run's current state ({} when none or expired)."""
        ...

    async def update(
        self, owner: MemoryOwner, state: dict[str, Any], ttl_seconds: float | None
    ) -> dict[str, Any]:
        """Merge ``state``'s keys into the run's state; return the result."""
        ...

    async def clear(self, owner: MemoryOwner) -> int:
        """Delete the run's state."""
        ...


@runtime_checkable
class LongTermStore(Protocol):
    """Durable memories, add-only, with validity intervals."""

    async def save(
        self,
        owner: MemoryOwner,
        memory: Memory,
        embedding: Sequence[float] | None = None,
        model_id: str | None = None,
    ) -> SaveResult:
        """Store ``memory`` under ``owner`` narrowed to its scope (dedup by hash)."""
        ...

    async def get(self, owner: MemoryOwner, memory_id: str) -> Memory | None:
        """One memory the caller may see, or None."""
        ...

    async def search(
        self, owner: MemoryOwner, query: str, *, limit: int = 10, as_of: datetime | None = None
    ) -> list[Memory]:
        """Memories matching ``query`` (lexical OR semantics, substring fallback)."""
        ...

    async def delete(self, owner: MemoryOwner, memory_id: str) -> bool:
        """Delete one of the caller's own memories."""
        ...
