"""Session TTL: recent turns expire after a stretch of inactivity (seed 004).

A session's turns stay visible while the session is active; once no turn has
arrived for ``session_ttl_hours`` (``MemoryManagerConfig``, default 24 h), all
of its turns are invisible at once, and a turn appended later starts a fresh
window. The predicate decides at read time, like working state's expiry:
among the newest turns, those up to the first gap longer than the TTL (the gap
from the newest turn to now included) are the live ones. Nothing is deleted by
a read; :meth:`MemoryManager.apply_retention` reclaims the hidden turns.
Summaries and memories extracted from the turns are not touched by either.

The built-in stores apply the predicate themselves (in SQL for PostgreSQL);
for any other short-term store, :class:`LiveTurns` applies it to the turns
``recent`` returns, from their ``created_at``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from harbor_pg.owner import MemoryOwner
from harbor_pg.records import ConversationMessage

__all__ = ["LiveTurns", "live_turns"]


def live_turns(
    turns: Sequence[ConversationMessage], ttl_seconds: float, now: datetime | None = None
) -> list[ConversationMessage]:
    """The suffix of ``turns`` (oldest first) a session TTL of ``ttl_seconds`` leaves visible."""
    limit = timedelta(seconds=ttl_seconds)
    newer = now or datetime.now(UTC)
    start = len(turns)
    for i in range(len(turns) - 1, -1, -1):
        created = turns[i].created_at
        if created is None:
            break
        if newer - created > limit:
            break
        start = i
        newer = created
    return list(turns[start:])


def _takes_ttl(store: object) -> bool:
    try:
        return "ttl_seconds" in inspect.signature(store.recent).parameters  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return False


class LiveTurns:
    """A short-term store seen through a session TTL (``ttl_seconds``; None: never expire).

    ``recent`` returns only live turns; every other attribute is the store's own.
    """

    def __init__(self, store: Any, ttl_seconds: float | None) -> None:
        self.store = store
        self.ttl_seconds = ttl_seconds
        self._native = _takes_ttl(store)

    async def recent(self, owner: MemoryOwner, limit: int) -> list[ConversationMessage]:
        """The newest ``limit`` live turns, oldest first."""
        if self.ttl_seconds is None:
            return list(await self.store.recent(owner, limit))
        if self._native:
            return list(await self.store.recent(owner, limit, ttl_seconds=self.ttl_seconds))
        return live_turns(await self.store.recent(owner, limit), self.ttl_seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)
